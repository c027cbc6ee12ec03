"""Slurm, in pure functions: the batch job of a pod, the names of simrun's jobs, Slurm's job
states as simrun's pod facts, and the parsers of the client commands' text output.

A pod is a batch job named `simrun-<run id>-<task>-<worker>` (so Slurm's own records, its queue
and its job completion log, name the run) with the attempt it starts as in its comment
(`simrun:<attempt>`). The coordinator and an unsplit task run in the base partition of the run's
priority class with `--no-requeue`, the extra workers of a split task in its extra partition
with `--requeue`: a preempted extra worker waits in the queue again, and the attempt it runs
then is its first attempt plus Slurm's restart count (`SLURM_RESTART_COUNT`, computed in the
script), so a requeue is an attempt like any other. Its output goes to the run's store, the
same layout as local mode: `tasks/<task>/logs/<worker>-<attempt>.log`.

The grace of a worker after SIGTERM is Slurm's own: `scancel` and a preemption by requeue send
SIGTERM to every process of the job and SIGKILL `KillWait` seconds later (a partition's
`GraceTime` adds to it for a preemption); no `--signal` is written (it signals before a time
limit, and simrun's jobs have none). `grace_s` is what the harness is told (`SIMRUN_GRACE_S`).

Text, not JSON: Slurm's `--json` changed its field names between releases; the `squeue
--Format` fields used here (`JobID`, `Name`, `Partition`, `State`, `Reason`, `NodeList`,
`RestartCnt`, `exit_code`, `STDOUT`, `Comment`) and `scontrol --oneliner` `key=value` pairs
hold from 20.11 on. The parsers are tested on outputs recorded from a real Slurm 22.05.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from simrun_core import exits
from simrun_core.gpus import CUDA_VISIBLE_DEVICES
from simrun_core.launch import ATTEMPT, NODE, SCRATCH, Launch
from simrun_core.planner import TaskPlan
from simrun_core.store import RUN_ID

JOB_PREFIX: Final = "simrun-"
COMMENT_PREFIX: Final = "simrun:"
MEMORY_KILL_TEXT: Final = "Exceeded job memory limit"
"""What slurmstepd writes into a job's output when JobAcctGather kills it above its `--mem`."""
SIGNAL_EXIT: Final = 128
_JOB_NAME: Final = re.compile(rf"{JOB_PREFIX}({RUN_ID.pattern})-(.+)")

SlurmFact = Literal["pending", "running", "succeeded", "failed", "memory", "lost", "preempted"]
"""What a Slurm job state says of the attempt it runs: waiting, running, ended well, ended with
an exit code, killed for memory, its node lost (retried without counting as a stop), preempted
(ended or requeued by a job of a higher partition)."""

JOB_STATES: Final[Mapping[str, SlurmFact]] = {
    "PENDING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending",
    "SUSPENDED": "pending",
    "CONFIGURING": "running",
    "RUNNING": "running",
    "COMPLETING": "pending",  # ending, or being requeued: nothing new until it ended
    "RESIZING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "STOPPED": "running",
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "CANCELLED": "failed",
    "TIMEOUT": "failed",
    "DEADLINE": "failed",
    "SPECIAL_EXIT": "failed",
    "OUT_OF_MEMORY": "memory",
    "NODE_FAIL": "lost",
    "BOOT_FAIL": "lost",
    "PREEMPTED": "preempted",
}
"""Slurm's job states (`squeue --states=all`, `scontrol show job`) as simrun's facts: the one
table. A state not in it (a later release's) reads as pending while the job is queued."""

FAILURE_HOLDS: Final = ("launch failed requeued held", "JobHoldMaxRequeue")
"""The reasons of a job Slurm held itself after failing to start it: a `--requeue` job whose
launch failed (its node's prolog failed, slurmstepd could not start: slurmd asks the controller
to requeue it held, its squeue reason the text "launch failed requeued held"), or one requeued
too often (`JobHoldMaxRequeue`). Held with priority 0, it never runs unless someone releases it.
A job a person held (`JobHeldAdmin`, `JobHeldUser`) is not one: it waits for them."""

QUEUE_FIELDS: Final = (
    "JobID",
    "Name",
    "Partition",
    "State",
    "Reason",
    "NodeList",
    "RestartCnt",
    "exit_code",
    "STDOUT",
    "Comment",
)
QUEUE_SEPARATOR: Final = "\x1f"
"""The unit separator ends each field of `queue_argv`: no job name, path or reason holds it."""


class SlurmOutputError(ValueError):
    """A line of a Slurm command's output that is not what simrun asked for; names the line."""


# -- names ------------------------------------------------------------------------------------


def job_name(run_id: str, task: str, worker: str) -> str:
    """The name of the batch job of a pod: `simrun-<run id>-<task>-<worker>`."""
    return f"{JOB_PREFIX}{run_id}-{task}-{worker}"


def run_of_job(name: str) -> str | None:
    """The run id of a simrun job's name; None for another job."""
    found = _JOB_NAME.fullmatch(name)
    return found.group(1) if found else None


def pod_of_job(name: str, plans: Mapping[str, TaskPlan]) -> tuple[str, str, str] | None:
    """The run, task and worker of a job name, given the plans of the run's tasks (a task id may
    hold dashes, so the task is the one of the plans whose worker completes the name); None for
    a name of another run's shape or of no planned worker."""
    found = _JOB_NAME.fullmatch(name)
    if found is None:
        return None
    run_id, rest = found.group(1), found.group(2)
    for task_id in sorted(plans, key=len, reverse=True):
        if rest.startswith(f"{task_id}-"):
            worker = rest[len(task_id) + 1 :]
            if worker in pod_workers(plans[task_id]):
                return run_id, task_id, worker
    return None


def pod_workers(plan: TaskPlan) -> tuple[str, ...]:
    """The workers of a task's pods: `w0` (the coordinator) to `w<pods-1>` of a split task,
    the task id of any other."""
    if plan.units is None:
        return (plan.task_id,)
    return tuple(f"w{index}" for index in range(plan.pods))


def attempt_comment(attempt: int) -> str:
    """The comment of a job: the attempt it starts (`simrun:<attempt>`)."""
    return f"{COMMENT_PREFIX}{attempt}"


def attempt_of_comment(comment: str) -> int | None:
    """The first attempt a job's comment names; None for a comment of another shape."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    number = comment.removeprefix(COMMENT_PREFIX)
    return int(number) if number.isdigit() else None


# -- the batch script -------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchJob:
    """The batch job of a pod attempt: its launch and where Slurm runs it."""

    launch: Launch
    argv: Sequence[str]
    """The command of the job: the harness (`python -m simrun_harness.<entry>`) or a `command`
    task's argv."""
    partition: str
    cores: int
    memory_mb: int
    gpus: int
    requeue: bool
    log_dir: str
    scratch_root: str
    account: str | None = None
    reservation: str | None = None
    options: tuple[str, ...] = ()
    environment: Mapping[str, str] | None = None
    """Variables set before the launch's (e.g. `PYTHONPATH` with the run's model)."""

    @property
    def name(self) -> str:
        """The job's name (`job_name`)."""
        return job_name(self.launch.run, self.launch.task, self.launch.worker)

    @property
    def log_path(self) -> str:
        """The output of the job's first attempt (a requeued one writes its own)."""
        return f"{self.log_dir}/{self.launch.worker}-{self.launch.attempt}.log"


def sbatch_lines(job: BatchJob) -> list[str]:
    """The `#SBATCH` options of a job: requests equal limits (`--cpus-per-task`, `--mem`,
    `--gres=gpu:N`), the partition, requeue or not, the output into the store, the attempt in
    the comment; then the site's account, the run's reservation and the extra options."""
    options = [
        f"--job-name={job.name}",
        f"--partition={job.partition}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={job.cores}",
        f"--mem={job.memory_mb}M",
        *([f"--gres=gpu:{job.gpus}"] if job.gpus else []),
        "--requeue" if job.requeue else "--no-requeue",
        f"--output={job.log_path}",
        "--open-mode=append",
        f"--chdir={job.launch.task_dir}",
        f"--comment={attempt_comment(job.launch.attempt)}",
        *([f"--account={job.account}"] if job.account else []),
        *([f"--reservation={job.reservation}"] if job.reservation else []),
        *job.options,
    ]
    return [f"#SBATCH {option}" for option in options]


def batch_script(job: BatchJob) -> str:
    """The batch script of a job: its `#SBATCH` options, the launch's environment, the attempt
    (the first plus Slurm's restarts), the node and the scratch of the attempt, its output into
    the attempt's log, then the command in place of the shell (it gets Slurm's signals).

    A job asking no GPUs gets `CUDA_VISIBLE_DEVICES` empty, so it sees none (as locally and in
    a pod without a GPU request): Slurm sets the variable only for a job given GPUs, and sbatch
    would else hand it the value of the service's own environment."""
    launch = job.launch
    env = dict(job.environment or {})
    env.update(launch.to_env())
    if not job.gpus:
        env[CUDA_VISIBLE_DEVICES] = ""
    for set_below in (ATTEMPT, NODE, SCRATCH):
        env.pop(set_below, None)
    scratch = f"{job.scratch_root}/{launch.run}/{launch.task}/{launch.worker}"
    lines = [
        "#!/bin/bash",
        *sbatch_lines(job),
        f"# simrun: run {launch.run}, task {launch.task}, worker {launch.worker}",
        *(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())),
        f"export {ATTEMPT}=$(( {launch.attempt} + ${{SLURM_RESTART_COUNT:-0}} ))",
        f'export {NODE}="${{SLURMD_NODENAME:-$(hostname)}}"',
        f'export {SCRATCH}={shlex.quote(scratch)}/"$SIMRUN_ATTEMPT"',
        f'mkdir -p "${SCRATCH}"',
        f'exec >>{shlex.quote(job.log_dir)}/{shlex.quote(launch.worker)}-"${ATTEMPT}".log 2>&1',
        "exec " + shlex.join(job.argv),
    ]
    return "\n".join(lines) + "\n"


def memory_mb(memory_gb: float) -> int:
    """The `--mem` of a pod's memory in GiB, in MiB (Slurm's M)."""
    return max(1, round(memory_gb * 1024))


def partition_of(priority_class: str, partitions: Mapping[str, str]) -> str:
    """The partition of a priority class: the site's mapping, else the class's own name."""
    return partitions.get(priority_class, priority_class)


# -- the states of jobs -----------------------------------------------------------------------


@dataclass(frozen=True)
class JobStatus:
    """A job as `squeue --states=all` (or `scontrol show job`) shows it."""

    job_id: str
    name: str
    partition: str
    state: str
    reason: str
    nodes: str
    restarts: int
    exit_code: int | None
    """The exit code of the job's script, 128 + the signal for one killed by a signal; None
    while it runs or where Slurm does not say."""
    stdout: str
    comment: str

    @property
    def fact(self) -> SlurmFact:
        """What the state says (`JOB_STATES`); an unknown state reads as pending."""
        return JOB_STATES.get(self.state.rstrip("+"), "pending")

    @property
    def first_attempt(self) -> int | None:
        """The attempt the job started with (its comment)."""
        return attempt_of_comment(self.comment)

    @property
    def attempt(self) -> int | None:
        """The attempt the job runs (or ran) now: its first plus its restarts."""
        first = self.first_attempt
        return None if first is None else first + self.restarts

    @property
    def held_after_failure(self) -> bool:
        """Whether Slurm held the job after failing to start it (`FAILURE_HOLDS`): the attempt
        it was to start ended without running, and the one it waits to run never will."""
        return self.fact == "pending" and self.reason in FAILURE_HOLDS and self.restarts > 0

    @property
    def covered_attempts(self) -> range:
        """The attempts the job started or will start itself: its first to the one it runs now,
        less that one when it is held after a failure (a new job must run it)."""
        first = self.first_attempt
        if first is None or self.attempt is None:
            return range(0)
        return range(first, self.attempt if self.held_after_failure else self.attempt + 1)

    @property
    def node(self) -> str | None:
        """The node of a job that runs or ran; None for one that waits."""
        return self.nodes if self.nodes and self.nodes not in ("(null)", "None") else None


def queue_argv(user: str) -> list[str]:
    """The one `squeue` of every job of the service's user, ended ones too (Slurm keeps them
    `MinJobAge` seconds), in the fields `parse_queue` reads."""
    fields = ",".join(f"{field}:{QUEUE_SEPARATOR}" for field in QUEUE_FIELDS)
    return ["squeue", "--noheader", "--states=all", f"--user={user}", f"--Format={fields}"]


def parse_queue(text: str) -> list[JobStatus]:
    """The simrun jobs of `queue_argv`'s output (others' jobs left out); SlurmOutputError
    naming a line of the wrong shape."""
    jobs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        values = [value.strip() for value in line.split(QUEUE_SEPARATOR)]
        if values and values[-1] == "":
            values.pop()
        if len(values) != len(QUEUE_FIELDS):
            raise SlurmOutputError(
                f"squeue: line {number} has {len(values)} fields, not {len(QUEUE_FIELDS)}: {line!r}"
            )
        job = dict(zip(QUEUE_FIELDS, values, strict=True))
        if run_of_job(job["Name"]) is None:
            continue
        jobs.append(
            JobStatus(
                job_id=job["JobID"],
                name=job["Name"],
                partition=job["Partition"],
                state=job["State"],
                reason=job["Reason"],
                nodes=job["NodeList"],
                restarts=_count(job["RestartCnt"], "RestartCnt", number),
                exit_code=_wait_status(job["exit_code"], job["State"]),
                stdout=job["STDOUT"],
                comment="" if job["Comment"] == "(null)" else job["Comment"],
            )
        )
    return jobs


def parse_oneliner(text: str) -> list[dict[str, str]]:
    """The `key=value` pairs of each line of `scontrol show ... --oneliner` (a value holds no
    blank; one that Slurm leaves empty is "")."""
    records = []
    for line in text.splitlines():
        if line.strip():
            records.append(dict(re.findall(r"([\w/:]+)=(\S*)", line)))
    return records


def job_from_scontrol(fields: Mapping[str, str]) -> JobStatus:
    """A job of `scontrol show job --oneliner` (`parse_oneliner`); its `ExitCode` is `N:S`."""
    code, _, signal = fields.get("ExitCode", "0:0").partition(":")
    state = fields.get("JobState", "")
    ended = JOB_STATES.get(state) not in ("pending", "running")
    exit_code = None
    if ended and code.isdigit() and signal.isdigit():
        exit_code = SIGNAL_EXIT + int(signal) if int(signal) else int(code)
    comment = fields.get("Comment", "")
    return JobStatus(
        job_id=fields.get("JobId", ""),
        name=fields.get("JobName", ""),
        partition=fields.get("Partition", ""),
        state=state,
        reason=fields.get("Reason", ""),
        nodes=fields.get("NodeList", ""),
        restarts=int(fields.get("Restarts", "0") or 0),
        exit_code=exit_code,
        stdout=fields.get("StdOut", ""),
        comment="" if comment == "(null)" else comment,
    )


def is_memory_kill(job: JobStatus, output: str) -> bool:
    """Whether a job that ended was killed for memory: Slurm says OUT_OF_MEMORY, or it died of
    SIGKILL and slurmstepd wrote "Exceeded job memory limit" into its output."""
    if job.fact == "memory":
        return True
    return job.exit_code == SIGNAL_EXIT + 9 and MEMORY_KILL_TEXT in output


# -- what a job's state says of its attempts --------------------------------------------------


@dataclass(frozen=True)
class AttemptChange:
    """A phase of an attempt of a pod, as a job's state says it."""

    attempt: int
    phase: Literal["pending", "running", "preempted", "succeeded", "failed"]
    exit_code: int | None = None
    node: str | None = None
    message: str | None = None
    memory_suspect: bool = False
    """The attempt died of SIGKILL: read its output for slurmstepd's memory kill."""


RANKS: Final = {"pending": 0, "running": 1, "preempted": 2, "succeeded": 2, "failed": 2}
"""The order of the phases of an attempt; the last three end it."""


def attempt_changes(
    known: tuple[int, str] | None, job: JobStatus, *, requeued_reason: str = "preempted"
) -> list[AttemptChange]:
    """The phases a job's attempts went through since `known` (the last attempt and phase
    reported of it, None when none was): the attempts before the one it runs now ended
    preempted (Slurm requeued them: a job of a higher partition, or their node went down), and
    the one it runs now moved forward, filling in what a poll missed (a job seen ended had run).
    Pure; phases only move forward, an ended attempt is never reported again.

    A job Slurm held after failing to start it (`JobStatus.held_after_failure`) ends the
    attempt it was to start failed, naming Slurm's reason, with the exit code of a stop from
    outside (the decider retries it a few times, as a new job: the backend cancels the held
    one); its own next attempt is never reported (report `known` as that attempt ended)."""
    attempt = job.attempt
    if attempt is None:
        return []
    held = job.held_after_failure
    current = attempt - 1 if held else attempt
    changes: list[AttemptChange] = []
    start = job.first_attempt if known is None else known[0]
    assert start is not None
    if known is not None and known[0] > current:
        return []
    last_phase = known[1] if known is not None else None
    for earlier in range(start, current):
        if earlier == start and last_phase is not None and RANKS[last_phase] >= 2:
            continue
        changes.append(
            AttemptChange(earlier, "preempted", message=f"requeued by Slurm ({requeued_reason})")
        )
    phase_before = last_phase if known is not None and known[0] == current else None
    if held:
        return changes + _held(job, current, phase_before)
    return changes + _forward(job, attempt, phase_before)


def _held(job: JobStatus, attempt: int, before: str | None) -> list[AttemptChange]:
    """The phases of the attempt a job held after a failure was to start: it waited, then
    ended failed without running."""
    rank_before = -1 if before is None else RANKS[before]
    message = (
        f"Slurm job {job.job_id} did not start and was held by Slurm ({job.reason}); "
        "simrun cancels it"
    )
    wanted = [
        AttemptChange(attempt, "pending"),
        AttemptChange(attempt, "failed", exit_code=exits.TERMINATED, message=message),
    ]
    return [change for change in wanted if RANKS[change.phase] > rank_before]


def _forward(job: JobStatus, attempt: int, before: str | None) -> list[AttemptChange]:
    """The phases of the attempt a job runs now after `before` (None: none reported)."""
    rank_before = -1 if before is None else RANKS[before]
    if rank_before >= 2:
        return []
    fact = job.fact
    wanted: list[AttemptChange] = []
    ran = fact in ("succeeded", "memory") or job.node is not None
    if fact == "pending":
        wanted.append(AttemptChange(attempt, "pending"))
    elif fact == "running":
        wanted += [AttemptChange(attempt, "pending"), _running(job, attempt)]
    else:
        wanted.append(AttemptChange(attempt, "pending"))
        if ran:
            wanted.append(_running(job, attempt))
        wanted.append(_end(job, attempt))
    return [change for change in wanted if RANKS[change.phase] > rank_before]


def _running(job: JobStatus, attempt: int) -> AttemptChange:
    return AttemptChange(attempt, "running", node=job.node)


def _end(job: JobStatus, attempt: int) -> AttemptChange:
    fact = job.fact
    where = f"Slurm job {job.job_id} {job.state}"
    if fact == "succeeded":
        return AttemptChange(attempt, "succeeded", exit_code=0, node=job.node)
    if fact in ("lost", "preempted"):
        why = "its node failed" if fact == "lost" else "preempted"
        return AttemptChange(attempt, "preempted", node=job.node, message=f"{where}: {why}")
    code = job.exit_code
    if fact == "memory":
        code = SIGNAL_EXIT + 9
    elif code is None or (code == 0 and fact == "failed"):
        code = SIGNAL_EXIT + 15 if job.state in ("CANCELLED", "TIMEOUT", "DEADLINE") else 1
    reason = f" ({job.reason})" if job.reason and job.reason != "None" else ""
    return AttemptChange(
        attempt,
        "failed",
        exit_code=code,
        node=job.node,
        message=f"{where}{reason}",
        memory_suspect=fact == "memory" or code == SIGNAL_EXIT + 9,
    )


# -- nodes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmNode:
    """A node of the partitions as `scontrol show node` shows it."""

    name: str
    cpus: int
    memory_mb: int
    gpus: int
    state: str
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        """Whether jobs may start there (not down, drained or failing)."""
        bad = ("DOWN", "DRAIN", "FAIL", "INVAL", "NOT_RESPONDING", "POWERED_DOWN")
        return not any(word in self.state for word in bad)


def gpus_of_gres(gres: str) -> int:
    """The GPUs of a `Gres` value (`gpu:2`, `gpu:a100:4(S:0)`, `gpu:2,shard:8`, `(null)`)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def nodes_of_scontrol(text: str, partitions: Iterable[str]) -> list[SlurmNode]:
    """The nodes of `scontrol show node --oneliner` in one of `partitions`, by name."""
    wanted = set(partitions)
    nodes = []
    for fields in parse_oneliner(text):
        theirs = tuple(p for p in fields.get("Partitions", "").split(",") if p)
        if not wanted.intersection(theirs):
            continue
        nodes.append(
            SlurmNode(
                name=fields.get("NodeName", ""),
                cpus=int(fields.get("CPUTot", "0") or 0),
                memory_mb=int(fields.get("RealMemory", "0") or 0),
                gpus=gpus_of_gres(fields.get("Gres", "")),
                state=fields.get("State", ""),
                partitions=theirs,
            )
        )
    return sorted(nodes, key=lambda node: node.name)


def _count(value: str, field: str, line: int) -> int:
    if not value.isdigit():
        raise SlurmOutputError(f"squeue: line {line}: {field} {value!r} is not a count")
    return int(value)


def _wait_status(value: str, state: str) -> int | None:
    """squeue's `exit_code` is the job's wait status: the code in its high byte, a signal in
    its low seven bits; None while the job has not ended."""
    if JOB_STATES.get(state.rstrip("+")) in ("pending", "running", None) or not value.isdigit():
        return None
    status = int(value)
    signal = status & 0x7F
    return SIGNAL_EXIT + signal if signal else status >> 8


def config_seconds(text: str, key: str) -> int | None:
    """A duration of `scontrol show config` (`KillWait                = 30 sec`) in seconds;
    None when the output has no such line."""
    found = re.search(rf"^{re.escape(key)}\s*=\s*(\d+)\s*sec\b", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def grace_problem(grace_s: float, kill_wait_s: int) -> str | None:
    """Why `slurm.grace_s` would be a promise Slurm breaks, None when it is not: a job that is
    cancelled (or requeued by a preemption, which adds a partition's `GraceTime`) gets SIGTERM,
    then SIGKILL `KillWait` seconds later, whatever the harness was told."""
    if grace_s <= kill_wait_s:
        return None
    return (
        f"slurm.grace_s is {grace_s:g} s, more than this Slurm's KillWait of {kill_wait_s} s "
        "(the seconds a job has after SIGTERM before SIGKILL): set slurm.grace_s to "
        f"{kill_wait_s} or less, or raise KillWait in slurm.conf"
    )


def expand_hostlist(text: str) -> list[str]:
    """The node names of a Slurm host list as `scontrol` prints it (`node[1-3,7],gpu01`,
    `rack[1-2]-n[01-02]`: ranges keep their zero padding); "" and `(null)` are none."""
    if text in ("", "(null)"):
        return []
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            if not literal and not ranges:
                continue
            choices = [literal + number for number in _numbers(ranges)] if ranges else [literal]
            expanded = [head + choice for head in expanded for choice in choices]
        names += expanded
    return names


def _numbers(ranges: str) -> list[str]:
    """The numbers of a host list's brackets (`1-3,7`, `01-10`), with their padding."""
    numbers = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not high:
            numbers.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return numbers


def reservation_name(run_id: str) -> str:
    """The name of the Slurm reservation of a run's node."""
    return f"{JOB_PREFIX}{run_id}"


def run_of_reservation(name: str) -> str | None:
    """The run id of a reservation `reservation_name` made; None for another reservation."""
    run_id = name.removeprefix(JOB_PREFIX)
    return run_id if name.startswith(JOB_PREFIX) and RUN_ID.fullmatch(run_id) else None


def partitions_conf(nodes: str = "ALL") -> str:
    """The `slurm.conf` fragment of simrun's six partitions: each priority class a partition of
    its name with the class's value as `PriorityTier`, a higher tier requeueing the jobs of a
    lower one (`preempt/partition_prio`, `REQUEUE`)."""
    from simrun_core.planner import priority_class_values

    lines = [
        "# simrun's priority classes as partitions: a job of a higher PriorityTier requeues",
        "# the jobs of a lower one (the extra workers of a run, which ask --requeue).",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
    ]
    for name, tier in priority_class_values().items():
        lines.append(
            f"PartitionName={name} Nodes={nodes} PriorityTier={tier} OverSubscribe=NO "
            "MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"
