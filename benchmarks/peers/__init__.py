"""peers: the same work in simrun and in Dask, Ray and Snakemake, a row per (work, peer).

The work of issue 16's table, everywhere the same (`work.py`): a unit sleeps, then writes one
small JSON file; a final step sums them. Works: squares (`squares_units` x `squares_sleep_s`),
a chain of `chain_tasks` one-unit tasks, and zero-work squares of each `peers_zero_units`.

- simrun: `simrun submit --local --wait` against a running local service (local_overhead's
  `submit_wait`, service.py's service), a fresh python per work.
- Dask (`dask_work.py`): a LocalCluster of one single-threaded process per core, started once
  like the service; each work a fresh python connecting a Client and using futures.
- Ray (`ray_work.py`): `ray.init(num_cpus=cores)` started once; each work a fresh driver.
- Snakemake (`snakemake_work.py`): `snakemake --cores N --scheduler greedy` of a generated
  Snakefile, a fresh python per work (it has no service), a process per job; fewer rounds
  (`peers_snakemake_reps`) and no zero-work size above `peers_snakemake_max_units`.

Each figure is a wall of the fresh python, as the user waits for it: its start and imports are
counted as simrun's CLI start is; the clusters' start is not, as the service's is not. In every
round simrun and each peer run once, the order rotating from round to round; a row compares the
medians over the same rounds. A peer that cannot be imported gives a row that says it was
skipped (`pip install -e .[bench]`), never a failure. At the test suite's size (`peers_run`
false) only the check that each peer imports runs, so installed peers never slow the suite;
tests/benchmarks/test_peers.py runs them at a tiny size, marked slow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks.common import Context, Row, Size, median
from benchmarks.local_overhead import chain_workflow, run_seconds, squares_workflow, submit_wait
from benchmarks.service import environment, start_service, stop_service

HERE = Path(__file__).resolve().parent
MISSING_EXIT = 3  # work.MISSING_EXIT: a peer script that cannot import its peer
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
WORK_TIMEOUT_S = 600.0
SIMRUN = "simrun"
INSTALL = "pip install -e .[bench]"
TESTED = "tests/benchmarks/test_peers.py runs it"


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer: its name, its script, whether it runs a cluster between works (`serve`)."""

    name: str
    script: str
    serves: bool


PEERS = (
    Peer("dask", "dask_work.py", serves=True),
    Peer("ray", "ray_work.py", serves=True),
    Peer("snakemake", "snakemake_work.py", serves=False),
)


@dataclasses.dataclass(frozen=True)
class PeerWork:
    """One work of the table and how often each contender runs it (0: not at all)."""

    key: str
    label: str
    kind: str  # squares or chain
    count: int  # units, or tasks of a chain
    sleep_s: float
    reps: dict[str, int]

    @property
    def work_s(self) -> float:
        """The seconds of sleep of a chain (its tasks run one after the other)."""
        return self.count * self.sleep_s if self.kind == "chain" else 0.0


def peer_works(size: Size) -> list[PeerWork]:
    """The works of a size, with the repetitions of each contender.

    Snakemake starts a process per job (~30 s per 1,000 units here): it runs
    `peers_snakemake_reps` rounds of each work, the zero-work squares only up to
    `peers_snakemake_max_units`."""
    names = (SIMRUN, *(peer.name for peer in PEERS))

    def repetitions(reps: int, units: int) -> dict[str, int]:
        counts = dict.fromkeys(names, reps)
        runs = units <= size.peers_snakemake_max_units
        counts["snakemake"] = min(reps, size.peers_snakemake_reps) if runs else 0
        return counts

    works = [
        PeerWork(
            "squares",
            f"{size.squares_units} units x {size.squares_sleep_s:g} s",
            "squares",
            size.squares_units,
            size.squares_sleep_s,
            repetitions(size.peers_reps, size.squares_units),
        ),
        PeerWork(
            "chain",
            f"chain of {size.chain_tasks} one-unit tasks of {size.chain_sleep_s:g} s",
            "chain",
            size.chain_tasks,
            size.chain_sleep_s,
            repetitions(size.peers_reps, 1),
        ),
    ]
    for units, reps in zip(size.peers_zero_units, size.peers_zero_reps, strict=True):
        counts = repetitions(reps, units)
        works.append(
            PeerWork(f"zero-{units}", f"{units:,} units x 0 s", "squares", units, 0.0, counts)
        )
    return works


def round_orders(reps: dict[str, int]) -> list[list[str]]:
    """The contenders of each round, in the order they run: those with repetitions left, the
    first of the round moving one place on every round, so none always runs first or last."""
    orders = []
    for rep in range(max(reps.values(), default=0)):
        names = [name for name, count in reps.items() if count > rep]
        shift = rep % len(names)
        orders.append(names[shift:] + names[:shift])
    return orders


@dataclasses.dataclass
class Sample:
    """One repetition of a contender: its wall and the phases it reported."""

    wall_s: float
    phases: dict[str, float]


@dataclasses.dataclass
class PeerSession:
    """A peer ready to run works: its cluster's process and address when it serves one."""

    peer: Peer
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    address: str = ""
    temp_dir: Path | None = None


class PeerUnavailable(Exception):
    """A peer cannot run here; the message says why (for the row)."""


class PeerFailed(Exception):
    """A peer's work failed or took too long: a short message for the row, `detail` for the
    log."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def peer_environment() -> dict[str, str]:
    """The environment of every peer process: no remote simrun settings, no telemetry, and for
    Ray a token of its own (so it neither writes one to ~/.ray nor runs without one)."""
    env = environment()
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return env


def check_peers(
    peers: tuple[Peer, ...], env: dict[str, str], log: Callable[[str], None]
) -> dict[str, str]:
    """Why each peer that cannot run here cannot (its script's `check`, side by side: a fresh
    python importing the peer), by name."""
    checks = {
        peer.name: subprocess.Popen(
            [sys.executable, str(HERE / peer.script), "check"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        for peer in peers
    }
    reasons = {}
    for name, process in checks.items():
        _, stderr = process.communicate(timeout=120)
        if process.returncode == MISSING_EXIT:
            reasons[name] = f"{name} not installed ({INSTALL})"
        elif process.returncode != 0:
            log(f"{name} check failed: {stderr.decode(errors='replace')[-2000:]}")
            reasons[name] = f"{name} failed its check (see the log)"
    return reasons


def start_peer(peer: Peer, env: dict[str, str]) -> PeerSession:
    """Start the peer's cluster, if it has one, without waiting for it (`await_peer` does)."""
    if not peer.serves:
        return PeerSession(peer, env)
    temp_dir = Path(tempfile.mkdtemp(prefix=f"simrun-{peer.name}-"))  # short: Ray's sockets
    argv = [sys.executable, str(HERE / peer.script), "serve"]
    argv += [str(temp_dir)] if peer.name == "ray" else []
    with open(temp_dir / "serve.log", "wb") as serve_log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=serve_log,
            env=env,
            start_new_session=True,
        )
    return PeerSession(peer, env, process, temp_dir=temp_dir)


def await_peer(session: PeerSession, log: Callable[[str], None]) -> None:
    """Wait until the peer's cluster prints its address; PeerUnavailable (and the cluster
    stopped) if it cannot run."""
    process, peer = session.process, session.peer
    if process is None:
        return
    try:
        line = _first_line(process, START_TIMEOUT_S)
    except PeerUnavailable as error:
        code = process.poll()
        stop_peer(session)
        if code == MISSING_EXIT:
            raise PeerUnavailable(f"{peer.name} not installed ({INSTALL})") from None
        assert session.temp_dir is not None
        log(f"{peer.name} did not start: {error}; its log:\n{_tail(session.temp_dir)}")
        raise PeerUnavailable(f"{peer.name} did not start (see the log)") from None
    session.address = json.loads(line)["address"]


def _first_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    """The first line the process prints, waiting at most `timeout` seconds for it."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline().decode()
            if line:
                return line
            raise PeerUnavailable(f"it exited {process.wait()}")
        if process.poll() is not None:
            raise PeerUnavailable(f"it exited {process.returncode}")
    raise PeerUnavailable(f"no address in {timeout:g} s")


def stop_peer(session: PeerSession) -> None:
    """Close the cluster's stdin (it shuts down) and wait; kill its group if it hangs."""
    process = session.process
    if process is not None:
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # workers its shutdown left behind
    if session.temp_dir is not None:
        shutil.rmtree(session.temp_dir, ignore_errors=True)


def run_peer(session: PeerSession, work: PeerWork, out: Path) -> Sample:
    """One work in a fresh python of the peer; its wall and phases."""
    argv = [sys.executable, str(HERE / session.peer.script), work.kind, str(work.count)]
    argv += [repr(work.sleep_s), str(out), *([session.address] if session.address else [])]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=session.env, timeout=WORK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise PeerFailed(f"{session.peer.name} took over {WORK_TIMEOUT_S:g} s") from None
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise PeerFailed(f"{session.peer.name} exited {done.returncode}", done.stderr[-3000:])
    last = done.stdout.strip().splitlines()[-1]
    return Sample(wall, json.loads(last)["figures"])


def run(ctx: Context) -> list[Row]:
    """Measure every work in simrun and in each peer that can run here; the rows. Without a
    peer to compare with, simrun is not measured either."""
    works = peer_works(ctx.size)
    env = peer_environment()
    unavailable = check_peers(PEERS, env, ctx.log)
    for peer in PEERS:
        if peer.name not in unavailable and not ctx.size.peers_run:
            unavailable[peer.name] = f"{peer.name} not run at size {ctx.size.name} ({TESTED})"
    samples: dict[tuple[str, str], list[Sample]] = {}
    failed: dict[tuple[str, str], str] = {}
    if len(unavailable) < len(PEERS):
        samples = measure(ctx, works, env, unavailable, failed)
    for name, reason in unavailable.items():
        ctx.log(f"{name}: skipped: {reason}")
    return [
        peer_row(work, peer.name, samples, unavailable, failed, ctx.size)
        for work in works
        for peer in PEERS
    ]


def measure(
    ctx: Context,
    works: list[PeerWork],
    env: dict[str, str],
    unavailable: dict[str, str],
    failed: dict[tuple[str, str], str],
) -> dict[tuple[str, str], list[Sample]]:
    """The samples of every work by (work, contender): simrun against its local service and
    each peer not `unavailable` (a peer whose cluster does not start joins `unavailable`; a
    peer's work that fails or times out joins `failed`, by (work, peer), and is not run again)."""
    project = ctx.scratch / "project"
    outs = (ctx.scratch / "out" / str(number) for number in itertools.count())
    samples: dict[tuple[str, str], list[Sample]] = {}
    sessions: dict[str, PeerSession] = {}
    service = start_service(project)
    try:
        began = time.perf_counter()
        for peer in PEERS:  # the clusters start side by side
            if peer.name not in unavailable:
                sessions[peer.name] = start_peer(peer, env)
        for name, session in list(sessions.items()):
            try:
                await_peer(session, ctx.log)
                ctx.log(f"{name} ready after {time.perf_counter() - began:.1f} s")
            except PeerUnavailable as error:
                del sessions[name]
                unavailable[name] = str(error)

        def simrun(work: PeerWork) -> Sample:
            workflow = project / f"{work.key}.yaml"
            if not workflow.exists():
                if work.kind == "chain":
                    document = chain_workflow(work.count, work.sleep_s)
                else:
                    document = squares_workflow(work.count, work.sleep_s)
                workflow.write_text(yaml.safe_dump(document))
            started = time.perf_counter()
            run_id = submit_wait(project, workflow)
            wall = time.perf_counter() - started
            return Sample(wall, {"service_s": run_seconds(project, run_id)})

        def contender(name: str, work: PeerWork) -> Sample:
            if name == SIMRUN:
                return simrun(work)
            return run_peer(sessions[name], work, next(outs))

        if ctx.size.warm_up:  # every contender once: imports in the page cache, workers up
            chain = next(work for work in works if work.kind == "chain")
            for name in (SIMRUN, *sessions):
                contender(name, chain)
        for work in works:
            reps = {name: count for name, count in work.reps.items() if name not in unavailable}
            ctx.log(f"{work.key}: {', '.join(f'{n} x{c}' for n, c in reps.items() if c)}")
            for order in round_orders(reps):
                for name in order:
                    if (work.key, name) in failed:
                        continue
                    try:
                        sample = contender(name, work)
                    except PeerFailed as error:  # its row says so; the others go on
                        failed[work.key, name] = str(error)
                        ctx.log(f"{work.key} {name}: {error}\n{error.detail}")
                        continue
                    samples.setdefault((work.key, name), []).append(sample)
                    ctx.log(f"{work.key} {name}: {sample.wall_s:.3f} s")
    finally:
        for session in sessions.values():
            stop_peer(session)
        stop_service(service)
    return samples


def peer_row(
    work: PeerWork,
    peer: str,
    samples: dict[tuple[str, str], list[Sample]],
    unavailable: dict[str, str],
    failed: dict[tuple[str, str], str],
    size: Size,
) -> Row:
    """The row of a work against a peer, from the samples of both (or why the peer is absent)."""
    ours = samples.get((work.key, SIMRUN), [])
    theirs = samples.get((work.key, peer), [])
    chain = work.kind == "chain"
    figure = per_task if chain else wall
    simrun_figure = figure(work, ours) if ours else None
    what = "s per task beyond the work" if chain else "wall"
    row = Row(
        key=f"peers.{work.key}.{peer}",
        benchmark=f"peers: {work.label}, {what}, simrun vs {peer}",
        simrun=simrun_figure,
        baseline=None,
        unit="s",
    )
    if peer in unavailable:
        row.goal = f"skipped: {unavailable[peer]}"
        return row
    if (work.key, peer) in failed:
        row.goal = f"skipped: {failed[work.key, peer]} (see the log)"
        return row
    if not theirs:
        row.goal = (
            f"skipped: {peer} above {size.peers_snakemake_max_units:,} units (a process per job)"
        )
        return row
    row.baseline = figure(work, theirs)
    row.note = sample_note(work, peer, ours, theirs)
    if chain:
        row.goal = "- (goal 1 is local_overhead's)"
        return row
    row.goal = f"simrun <= {peer}"
    row.met = simrun_figure is not None and simrun_figure <= row.baseline
    if row.met is False:
        row.gap = missed_gap(work, peer, ours, theirs)
    return row


def wall(work: PeerWork, runs: list[Sample]) -> float:
    """The median wall."""
    return median([sample.wall_s for sample in runs])


def per_task(work: PeerWork, runs: list[Sample]) -> float:
    """The median seconds per chained task beyond its sleep."""
    return median([(sample.wall_s - work.work_s) / work.count for sample in runs])


def phase(runs: list[Sample], name: str) -> float | None:
    """The median of a phase the runs reported, None if they did not."""
    values = [sample.phases[name] for sample in runs if name in sample.phases]
    return median(values) if values else None


def sample_note(work: PeerWork, peer: str, ours: list[Sample], theirs: list[Sample]) -> str:
    """How the row was measured, with the phases that explain it."""
    parts = [f"medians of {len(ours)} (simrun) and {len(theirs)} ({peer}) rotated rounds"]
    service = phase(ours, "service_s")
    if service is not None:
        parts.append(f"simrun's run inside the service (first to last event) {service:.3f} s")
    phases = {"imports_s": "imports", "connect_s": "connect", "work_s": "work in session"}
    told = [
        f"{label} {value:.3f} s"
        for name, label in phases.items()
        if (value := phase(theirs, name)) is not None
    ]
    parts.append(f"{peer}'s fresh python: " + ", ".join(told))
    return "; ".join(parts)


def missed_gap(work: PeerWork, peer: str, ours: list[Sample], theirs: list[Sample]) -> str:
    """Where the time of a lost row goes, from the phases measured in this run."""
    service = phase(ours, "service_s") or 0.0
    session = phase(theirs, "work_s") or 0.0
    return (
        f"simrun's wall {wall(work, ours):.3f} s against {peer}'s {wall(work, theirs):.3f} s. "
        f"Of simrun's wall, the run inside the service (first to last event) took "
        f"{service:.3f} s, the rest is the CLI (start, submission, the wait's end); {peer}'s "
        f"work inside its session took {session:.3f} s of its wall. A run inside the service "
        "slower than the peer's session points at the service and the harness (goals 1 and 3), "
        "a gap in the rest at the CLI (goal 2)."
    )


def _tail(temp_dir: Path) -> str:
    with contextlib.suppress(OSError):
        return (temp_dir / "serve.log").read_text(errors="replace")[-3000:]
    return "(no log)"
