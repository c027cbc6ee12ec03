"""The Slurm backend: the pods of runs as batch jobs, through Slurm's client commands.

A pod is a batch job (`simrun_core.slurm.batch_script`): the coordinator and an unsplit task in
the base partition of the run's priority class, the extra workers in its extra partition with
`--requeue`, requests equal limits, the logs in the run's directory of the store (which every
node mounts at the same path), the run id in every job's name. A task's jobs are submitted when
the decider starts it (`ready` at the submission, or `start_task`: every task it reads from is
done), not through Slurm dependencies, so a retry the decider asks (a new job of the next
attempt) needs nothing rewired and a task never waits in the queue for inputs that will not
come. A job that cannot be submitted for a task started later, or for a retry, is reported as
its attempt failed, naming sbatch's error (at the submission, the run is refused).

ONE poller follows every run: a `squeue --states=all` of the service's user every `poll_s`
(ended jobs stay in it for `MinJobAge`; no `sacct`, which needs slurmdbd), and at once then
every `QUICK_POLL_S` for a few seconds at most after a coordinator merged (the actor's hint,
`merged`: the coordinator's end is the task's, which would else wait up to `poll_s`), read
into attempts (`simrun_core.slurm.attempt_changes`) and reported as `PodChanged`: pending,
running, a requeue as the attempt preempted (the job runs the next attempt when it starts
again), COMPLETED, FAILED with its exit code, a kill for memory (OUT_OF_MEMORY, or SIGKILL with
slurmstepd's "Exceeded job memory limit" in the job's output), NODE_FAIL as preempted
(retried), CANCELLED; a job Slurm held after its launch failed (a prolog that failed: "launch
failed requeued held") as its attempt failed with a stop's exit code, and it is cancelled, so
the decider's retry is a new job.
The jobs outlive the service: a service started again finds its runs' jobs by name, takes them
over and submits only attempts no job covers. `cancel` is a `scancel` of the run's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from simrun_api.backends.base import (
    Capabilities,
    ReservationRefused,
    RunSubmission,
    workflow_name,
)
from simrun_api.settings import ServiceSettings
from simrun_core import exits, slurm
from simrun_core.errors import WorkflowError
from simrun_core.launch import main_worker
from simrun_core.messages import PodChanged
from simrun_core.planner import MAX_PIECES, Node
from simrun_core.slurm_jobs import SlurmSettings, batch_job_of
from simrun_core.store import RunPaths
from simrun_core.wire import PodUsage, ServerUsage

log = logging.getLogger(__name__)

CLIENT_COMMANDS: Final = ("sbatch", "squeue", "scancel", "scontrol")
COMMAND_TIMEOUT_S: Final = 60.0
CANCEL_MARGIN_S: Final = 30.0
"""How much longer than the grace `cancel` waits for the run's jobs to end."""
ENDED_RANK: Final = 2
QUICK_POLL_S: Final = 0.1
"""The period of the poll while a coordinator that merged has not been seen to end, and the
least time between two polls a hint asks (`PodHints`)."""
MERGE_HINT_WINDOW_S: Final = 10.0
"""How long after its merge a coordinator is polled for every `QUICK_POLL_S` (its harness
exits right after the merge); an end later than that is seen by the ordinary poll."""

Report = Callable[[PodChanged], None]
Pod = tuple[str, str]


class SlurmError(RuntimeError):
    """A Slurm client command that failed; the message holds the command and what it said."""


@dataclasses.dataclass(eq=False)
class _Run:
    submission: RunSubmission
    report: Report
    cancelled: bool = False
    succeeded: set[str] = dataclasses.field(default_factory=set)
    """The tasks whose coordinator's job COMPLETED (or done at the submission): once every
    task is and no job runs, the run is no longer followed."""
    started: set[str] = dataclasses.field(default_factory=set)
    jobs: dict[str, Pod] = dataclasses.field(default_factory=dict)
    """The run's jobs by id, each a (task, worker)."""
    known: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    """The last attempt and phase reported of each job."""
    latest: dict[Pod, slurm.JobStatus] = dataclasses.field(default_factory=dict)
    """The newest job of each pod as the last poll saw it."""
    submitted: set[tuple[str, str, int]] = dataclasses.field(default_factory=set)
    reservation: str | None = None
    firsts: dict[str, int] = dataclasses.field(default_factory=dict)
    """The first attempt of each job this service submitted (its comment says it too, unless
    the site or an admin changed the comment)."""
    held: set[str] = dataclasses.field(default_factory=set)
    """The jobs Slurm held after failing to start them (`JobStatus.held_after_failure`), which
    the poller cancelled."""
    merged: dict[str, float] = dataclasses.field(default_factory=dict)
    """The tasks whose coordinator merged and is not yet seen to end, with the loop's time of
    the hint (`SlurmBackend.merged`)."""

    @property
    def id(self) -> str:
        return self.submission.record.id


class SlurmBackend:
    """Runs the pods of runs as Slurm batch jobs (see the module)."""

    name = "slurm"
    max_pods = MAX_PIECES
    capabilities = Capabilities(
        reservations=True,
        pods_outlive_service=True,
        # The jobs write the store every node shares (NFS at most sites), where the merge
        # marker of a coordinator that succeeded may be seen later than its job's end.
        merge_marker_grace_s=120.0,
    )

    def __init__(
        self, store: Path, settings: SlurmSettings, env: dict[str, str] | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.capabilities = dataclasses.replace(
            SlurmBackend.capabilities, pod_start_s=settings.pod_start_s, pod_hints=self
        )
        self.python = settings.python or sys.executable
        self.env = env if env is not None else dict(os.environ)
        self.user = getpass.getuser()
        self._runs: dict[str, _Run] = {}
        self._poller: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()
        self._wake = asyncio.Event()
        """Set by a hint (`started`, `merged`): the next poll comes at once."""
        self._polled_at = 0.0
        self._closed = False
        self.calls: dict[str, int] = {}
        """How often each Slurm command ran (for the benchmarks: one poll an interval)."""

    # -- Slurm's commands ---------------------------------------------------------------------

    async def _call(self, *argv: str, stdin: str | None = None, check: bool = True) -> str:
        """A Slurm client command's output; SlurmError naming it and its error when it fails."""
        self.calls[argv[0]] = self.calls.get(argv[0], 0) + 1
        env = {k: v for k, v in self.env.items() if not k.startswith("SIMRUN_")}
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(
                process.communicate(stdin.encode() if stdin is not None else None),
                COMMAND_TIMEOUT_S,
            )
        except TimeoutError:
            process.kill()
            await process.wait()
            raise SlurmError(f"{argv[0]}: no answer within {COMMAND_TIMEOUT_S:g} s") from None
        if check and process.returncode != 0:
            why = err.decode(errors="replace").strip() or f"exit code {process.returncode}"
            raise SlurmError(f"{' '.join(argv[:2])}: {why}")
        return out.decode(errors="replace")

    async def _queue(self) -> list[slurm.JobStatus]:
        return slurm.parse_queue(await self._call(*slurm.queue_argv(self.user)))

    # -- nodes --------------------------------------------------------------------------------

    def _partitions(self) -> list[str]:
        from simrun_core.planner import priority_class_values

        return [slurm.partition_of(c, self.settings.partitions) for c in priority_class_values()]

    async def _slurm_nodes(self) -> list[slurm.SlurmNode]:
        text = await self._call("scontrol", "show", "node", "--oneliner")
        return slurm.nodes_of_scontrol(text, self._partitions())

    async def nodes(self) -> list[Node]:
        """The usable nodes of the partitions, with their cores, memory and GPUs; a node
        reserved for a run names it."""
        reserved = await self._reserved_nodes()
        return [
            Node(
                name=node.name,
                cores=node.cpus,
                memory_gb=node.memory_mb / 1024,
                gpus=node.gpus,
                reserved_by=reserved.get(node.name),
            )
            for node in await self._slurm_nodes()
            if node.usable
        ]

    async def servers(self) -> list[ServerUsage]:
        """The nodes of the partitions with their cores, memory and GPUs, and the running jobs
        of the runs on each."""
        reserved = await self._reserved_nodes()
        pods: dict[str, list[PodUsage]] = {}
        for run in self._runs.values():
            for (task, worker), job in run.latest.items():
                if job.fact != "running" or job.node is None:
                    continue
                plan = run.submission.record.plans.get(task)
                pods.setdefault(job.node, []).append(
                    PodUsage(
                        run_id=run.id,
                        task_id=task,
                        pod=f"{worker}-{job.attempt}"
                        if job.attempt is not None
                        else f"{worker} (Slurm job {job.job_id}, attempt unknown)",
                        phase="running",
                        cores=plan.shape.cores if plan else 0,
                        memory_gb=plan.shape.memory_gb if plan else 0,
                        gpus=plan.shape.gpus if plan else 0,
                    )
                )
        return [
            ServerUsage(
                name=node.name,
                cores=node.cpus,
                memory_gb=round(node.memory_mb / 1024, 3),
                gpus=node.gpus,
                reserved_by=reserved.get(node.name),
                pods=pods.get(node.name, []),
            )
            for node in await self._slurm_nodes()
        ]

    # -- reservations ------------------------------------------------------------------------

    async def _reserved_nodes(self) -> dict[str, str]:
        """The nodes reserved for runs (`simrun-<run>` reservations), by node: each node of a
        reservation's host list (`node[1-2]` when an admin gave a run's reservation more)."""
        text = await self._call("scontrol", "show", "reservation", "--oneliner", check=False)
        found = {}
        for fields in slurm.parse_oneliner(text):
            run_id = slurm.run_of_reservation(fields.get("ReservationName", ""))
            if run_id is not None:
                found.update(dict.fromkeys(slurm.expand_hostlist(fields.get("Nodes", "")), run_id))
        return found

    async def reserve(self, node: str, run_id: str) -> None:
        """A Slurm reservation `simrun-<run>` of the node for the service's user; the run's
        jobs then ask for it. ReservationRefused for an unknown node, one reserved for another
        run, or a user that may not create reservations (Slurm's operators and admins may)."""
        nodes = {n.name for n in await self._slurm_nodes()}
        if node not in nodes:
            raise ReservationRefused(f"node {node!r} is no node of simrun's partitions")
        holder = (await self._reserved_nodes()).get(node)
        if holder == run_id:
            return
        if holder is not None:
            raise ReservationRefused(f"node {node!r} is reserved for run {holder}")
        try:
            await self._call(
                "scontrol",
                "create",
                "reservation",
                f"reservationname={slurm.reservation_name(run_id)}",
                f"nodes={node}",
                "starttime=now",
                "duration=infinite",
                f"users={self.user}",
                "flags=ignore_jobs",
            )
        except SlurmError as error:
            raise ReservationRefused(
                f"Slurm refused a reservation of node {node!r} for the service's user "
                f"{self.user!r} (creating one needs Slurm's operator or admin level): {error}"
            ) from None

    async def release(self, node: str, run_id: str) -> None:
        """Delete the run's reservation; nothing when it is gone."""
        await self._call(
            "scontrol", "delete", f"reservationname={slurm.reservation_name(run_id)}", check=False
        )

    # -- runs ---------------------------------------------------------------------------------

    async def recover(self) -> int:
        """Nothing to clean up: the jobs of an earlier service are taken over by `submit`."""
        return 0

    def has(self, run_id: str) -> bool:
        return run_id in self._runs

    async def submit(self, run: RunSubmission, report: Report) -> str:
        """Take over the run's jobs Slurm has (found by name), then submit the jobs of its
        ready tasks that no job covers; the poller follows them. A run followed already is
        kept, and its ready tasks start (a restarted actor's resubmission: a `start_task` its
        crash lost)."""
        if self._closed:
            raise RuntimeError("the Slurm backend is closed")
        record = run.record
        existing = self._runs.get(record.id)
        if existing is not None:
            existing.report = report
            for task in record.workflow.order():
                if task.id in run.ready:
                    await self.start_task(record.id, task.id)
            return workflow_name(record.id)
        state = _Run(submission=run, report=report, succeeded=set(run.done))
        if record.reserved is not None:
            state.reservation = slurm.reservation_name(record.id)
        for job in await self._queue():
            if slurm.run_of_job(job.name) == record.id:
                self._adopt(state, job)
        self._runs[record.id] = state
        try:
            for task in record.workflow.order():
                if task.id in run.ready:
                    await self._start_task(state, task.id, refuse=True)
        except BaseException:
            self._runs.pop(record.id, None)
            raise
        self._ensure_poller()
        return workflow_name(record.id)

    def _adopt(self, run: _Run, job: slurm.JobStatus) -> Pod | None:
        """Follow a job of the run found in the queue (submitted by an earlier service): what
        the run's record knows of its attempt is not reported again."""
        pod = slurm.pod_of_job(job.name, run.submission.record.plans)
        first = job.first_attempt
        if pod is None or first is None:
            return None
        _, task, worker = pod
        run.jobs[job.job_id] = (task, worker)
        run.started.add(task)
        newest = run.latest.get((task, worker))
        if newest is None or (newest.first_attempt or 0) <= first:
            run.latest[(task, worker)] = job
        current = first + job.restarts
        run.submitted.update((task, worker, attempt) for attempt in job.covered_attempts)
        recorded = run.submission.record.pods.get(task, {}).get(worker)
        if task in run.submission.done:
            run.known[job.job_id] = (current, "succeeded")  # a task done: nothing new to say
        elif recorded is not None and recorded.attempt > current:
            run.known[job.job_id] = (current, "failed")  # an attempt the record has ended
        elif recorded is not None and recorded.attempt >= first:
            run.known[job.job_id] = (recorded.attempt, _phase_of(recorded.state))
        return task, worker

    async def _start_task(self, run: _Run, task: str, *, refuse: bool = False) -> None:
        """Submit the jobs of a task that has none yet (the next attempt of each worker). An
        sbatch that fails raises WorkflowError when `refuse` (the run's submission is refused),
        else it is that attempt's failure (`_submit_or_fail`)."""
        if run.cancelled or task in run.started or task in run.submission.done:
            return
        run.started.add(task)
        plan = run.submission.record.plans[task]
        try:
            for worker in slurm.pod_workers(plan):
                attempt = run.submission.next_attempts.get((task, worker), 0)
                retry_memory = (task, worker) in run.submission.retry_memory
                if refuse:
                    await self._submit_attempt(run, task, worker, attempt, retry_memory)
                else:
                    await self._submit_or_fail(run, task, worker, attempt, retry_memory)
        except BaseException:
            run.started.discard(task)  # a start asked again submits what no job covers
            raise

    async def start_task(self, run_id: str, task: str) -> None:
        """Submit the jobs of a task the decider starts."""
        run = self._runs.get(run_id)
        if run is not None:
            await self._start_task(run, task)

    async def _submit_or_fail(
        self, run: _Run, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """sbatch an attempt; an sbatch that fails is the attempt's failure, reported as a
        configuration error naming sbatch's answer, which the decider ends it with."""
        try:
            await self._submit_attempt(run, task, worker, attempt, retry_memory)
        except WorkflowError as error:
            run.report(
                PodChanged(
                    task=task,
                    worker=worker,
                    attempt=attempt,
                    phase="failed",
                    exit_code=exits.CONFIGURATION,
                    message=str(error),
                )
            )

    async def _submit_attempt(
        self, run: _Run, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """sbatch the job of an attempt, unless a job of the run covers it already."""
        if (task, worker, attempt) in run.submitted:
            return
        script = self.script(run.submission, task, worker, attempt, retry_memory, run.reservation)
        RunPaths(self.store, run.id).logs(task).mkdir(parents=True, exist_ok=True)
        RunPaths(self.store, run.id).out(task).mkdir(parents=True, exist_ok=True)
        run.submitted.add((task, worker, attempt))
        try:
            out = await self._call("sbatch", "--parsable", stdin=script)
        except SlurmError as error:
            run.submitted.discard((task, worker, attempt))
            raise WorkflowError(f"task {task!r}, worker {worker}: {error}") from None
        job_id = out.strip().split(";")[0]
        run.jobs[job_id] = (task, worker)
        run.firsts[job_id] = attempt
        run.known[job_id] = (attempt, "pending")
        run.report(PodChanged(task=task, worker=worker, attempt=attempt, phase="pending"))

    def script(
        self,
        submission: RunSubmission,
        task: str,
        worker: str,
        attempt: int,
        retry_memory: bool,
        reservation: str | None = None,
    ) -> str:
        """The batch script of an attempt (`batch_job_of`)."""
        return slurm.batch_script(
            batch_job_of(
                submission.record,
                submission.types,
                task,
                worker,
                attempt,
                retry_memory,
                store=self.store,
                settings=self.settings,
                python=self.python,
                reservation=reservation,
            )
        )

    async def retry(
        self, run_id: str, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """Submit `attempt` of a worker, unless its job runs it already (Slurm requeued it);
        nothing for a cancelled run."""
        run = self._runs.get(run_id)
        if run is None or run.cancelled:
            return
        await self._submit_or_fail(run, task, worker, attempt, retry_memory)

    async def cancel(self, run_id: str) -> None:
        """scancel every job of the run and wait (the grace and a margin at most) until the
        poller saw them end; the run is then no longer followed."""
        run = self._runs.get(run_id)
        if run is None:
            found = [j.job_id for j in await self._queue() if slurm.run_of_job(j.name) == run_id]
            if found:
                await self._call("scancel", *found, check=False)
            return
        run.cancelled = True
        if run.jobs:
            await self._call("scancel", *sorted(run.jobs), check=False)
        deadline = asyncio.get_running_loop().time() + self.settings.grace_s + CANCEL_MARGIN_S
        while self._live_jobs(run) and asyncio.get_running_loop().time() < deadline:
            self._polled.clear()
            self._ensure_poller()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._polled.wait(), self.settings.poll_s * 3 + 5)
        self._runs.pop(run_id, None)

    def _live_jobs(self, run: _Run) -> list[str]:
        """The jobs of a run whose last reported attempt has not ended."""
        return [
            job_id
            for job_id in run.jobs
            if job_id not in run.known or slurm.RANKS[run.known[job_id][1]] < ENDED_RANK
        ]

    async def logs(self, run_id: str, task: str) -> dict[str, str]:
        """The logs of a task's jobs from the store (`tasks/<task>/logs/<worker>-<attempt>.log`)."""
        directory = RunPaths(self.store, run_id).logs(task)
        texts = {}
        for path in sorted(directory.glob("*.log")):
            with contextlib.suppress(OSError):
                texts[path.stem] = path.read_text(errors="replace")
        return texts

    async def close(self) -> None:
        """Stop the poller; the jobs go on in Slurm (a service started again takes them over)."""
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        self._runs.clear()

    # -- the poller ---------------------------------------------------------------------------

    def _ensure_poller(self) -> None:
        if self._closed:
            return
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_forever(), name="slurm poller")

    async def _poll_forever(self) -> None:
        while self._runs and not self._closed:
            try:
                await self.poll()
            except Exception as error:  # the controller away a while: the next poll tries again
                log.warning("the poll of Slurm's queue failed: %s", error)
            self._polled.set()
            self._polled_at = asyncio.get_running_loop().time()
            await self._pause()

    async def _pause(self) -> None:
        """Wait until the next poll: `poll_s` after the last one ended, `QUICK_POLL_S` while a
        coordinator that merged is not seen to end, and as soon as a hint came (`started`,
        `merged`) but never sooner than `QUICK_POLL_S` after the last: hints add polls only
        while runs' pods start or end, at most one a `QUICK_POLL_S` for all the runs."""
        loop = asyncio.get_running_loop()
        interval = self.settings.poll_s
        if self._awaiting_ends():
            interval = min(interval, QUICK_POLL_S)
        remaining = self._polled_at + interval - loop.time()
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)
        soonest = self._polled_at + min(QUICK_POLL_S, self.settings.poll_s) - loop.time()
        if soonest > 0:
            await asyncio.sleep(soonest)
        self._wake.clear()

    def _awaiting_ends(self) -> bool:
        """Whether a run has a coordinator that merged within `MERGE_HINT_WINDOW_S` and whose
        success the poller has not seen yet (the others are forgotten here)."""
        now = asyncio.get_running_loop().time()
        awaiting = False
        for run in self._runs.values():
            for task, since in list(run.merged.items()):
                if run.cancelled or task in run.succeeded or now - since > MERGE_HINT_WINDOW_S:
                    del run.merged[task]
            awaiting = awaiting or bool(run.merged)
        return awaiting

    def started(self, run_id: str) -> None:
        """The hint of the actor that a pod of the run writes its harness log before a poll
        saw its job run (`Capabilities.pod_hints`): poll at once, so its start is reported
        and its units are read without waiting for the next `poll_s`."""
        run = self._runs.get(run_id)
        if run is not None and not run.cancelled and not self._closed:
            self._wake.set()
            self._ensure_poller()

    def merged(self, run_id: str, task: str) -> None:
        """The hint of the actor that the coordinator of a run's task merged
        (`Capabilities.merge_hints`): poll at once, then every `QUICK_POLL_S` until its job is
        seen to end (or `MERGE_HINT_WINDOW_S` passed), so the task ends and the next one starts
        without waiting for the next `poll_s`."""
        run = self._runs.get(run_id)
        if run is None or run.cancelled or task in run.succeeded or self._closed:
            return
        run.merged.setdefault(task, asyncio.get_running_loop().time())
        self._wake.set()
        self._ensure_poller()

    async def poll(self) -> None:
        """One `squeue` of every run's jobs; the changes go to each run's callback."""
        jobs = await self._queue()
        by_run: dict[str, list[slurm.JobStatus]] = {}
        for job in jobs:
            run_id = slurm.run_of_job(job.name)
            if run_id is not None:
                by_run.setdefault(run_id, []).append(job)
        for run_id, run in list(self._runs.items()):
            for job in sorted(by_run.get(run_id, []), key=lambda j: int(j.job_id.split("_")[0])):
                await self._follow(run, job)
            if self._finished(run):
                self._runs.pop(run_id, None)

    def _finished(self, run: _Run) -> bool:
        """Whether every task of a run succeeded and none of its jobs runs: nothing of it is
        left to follow."""
        tasks = {task.id for task in run.submission.record.workflow.tasks}
        return tasks <= run.succeeded and not self._live_jobs(run)

    async def _follow(self, run: _Run, job: slurm.JobStatus) -> None:
        first = run.firsts.get(job.job_id)
        if first is not None and job.first_attempt != first:
            # a job this service submitted whose comment the site or an admin replaced
            job = dataclasses.replace(job, comment=slurm.attempt_comment(first))
        if job.job_id not in run.jobs and self._adopt(run, job) is None:
            return
        task, worker = run.jobs[job.job_id]
        newest = run.latest.get((task, worker))
        if newest is None or (newest.first_attempt or 0) <= (job.first_attempt or 0):
            run.latest[(task, worker)] = job
        changes = slurm.attempt_changes(run.known.get(job.job_id), job)
        # a requeued job runs its next attempts itself, not one Slurm held after a failure
        run.submitted.update((task, worker, a) for a in job.covered_attempts)
        if job.held_after_failure and job.job_id not in run.held:
            # it would never run: cancelled, so the decider's retry, a new job, is the only one
            run.held.add(job.job_id)
            await self._call("scancel", job.job_id, check=False)
        for change in changes:
            oom = False
            if change.memory_suspect:
                oom = await asyncio.to_thread(_memory_killed, job)
            run.known[job.job_id] = (change.attempt, change.phase)
            run.report(
                PodChanged(
                    task=task,
                    worker=worker,
                    attempt=change.attempt,
                    phase=change.phase,
                    exit_code=change.exit_code,
                    node=change.node,
                    oom=oom,
                    message=change.message,
                )
            )
            if change.phase == "succeeded" and worker == main_worker(
                run.submission.record.plans[task]
            ):
                run.succeeded.add(task)
        if job.job_id in run.held and job.attempt is not None:
            run.known[job.job_id] = (job.attempt, "failed")  # its next attempt never runs


def _phase_of(state: str) -> str:
    """A pod state of the record as an attempt phase of `simrun_core.slurm.RANKS`."""
    return state if state in slurm.RANKS else "failed"


def _memory_killed(job: slurm.JobStatus) -> bool:
    """Whether an ended job was killed for memory (its state, or slurmstepd's line in its
    output)."""
    try:
        text = Path(job.stdout).read_text(errors="replace") if job.stdout else ""
    except OSError:
        text = ""
    return slurm.is_memory_kill(job, text)


def client_problem(env: dict[str, str], grace_s: float | None = None) -> str | None:
    """Why this machine cannot drive Slurm, in one line (a client command missing, the
    controller not answering `scontrol ping`, a `grace_s` above Slurm's `KillWait`), None when
    it can."""
    missing = [name for name in CLIENT_COMMANDS if shutil.which(name, path=env.get("PATH")) is None]
    if missing:
        return f"the Slurm client commands {', '.join(missing)} are not on PATH"
    try:
        ping = subprocess.run(
            ["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"scontrol ping failed: {error}"
    answer = " ".join((ping.stdout + ping.stderr).split())
    if ping.returncode != 0 or " is UP" not in answer:
        where = env.get("SLURM_CONF", "the default slurm.conf")
        return f"the Slurm controller does not answer (SLURM_CONF={where}): {answer}"
    # The poll's own squeue, once: a release that refuses one of its fields stops the service
    # here, naming it, instead of failing every poll while the runs wait.
    argv = slurm.queue_argv(getpass.getuser())
    try:
        queue = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        slurm.parse_queue(queue.stdout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{argv[0]} failed: {error}"
    except slurm.SlurmOutputError as error:
        return f"this Slurm's squeue answers in another shape than simrun reads: {error}"
    if queue.returncode != 0:
        said = " ".join(queue.stderr.split()) or f"exit code {queue.returncode}"
        return f"this Slurm's squeue refuses the fields simrun polls ({argv[-1]}): {said}"
    return None if grace_s is None else _grace_problem(env, grace_s)


def _grace_problem(env: dict[str, str], grace_s: float) -> str | None:
    """`slurm.grace_s` against the `KillWait` of `scontrol show config`."""
    try:
        config = subprocess.run(
            ["scontrol", "show", "config"], env=env, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"scontrol show config failed: {error}"
    kill_wait = slurm.config_seconds(config.stdout, "KillWait")
    if kill_wait is None:
        said = " ".join(config.stderr.split()) or "no line 'KillWait = N sec'"
        return f"scontrol show config does not say KillWait, which bounds slurm.grace_s: {said}"
    return slurm.grace_problem(grace_s, kill_wait)


def slurm_backend(settings: ServiceSettings, block: SlurmSettings | None = None) -> SlurmBackend:
    """The Slurm backend of service settings (`backend: slurm`) and their `slurm:` block.
    ValueError, in one line, when Slurm cannot be reached from here or its `KillWait` is
    shorter than the block's `grace_s` (`client_problem`)."""
    block = block if block is not None else SlurmSettings()
    problem = client_problem(dict(os.environ), grace_s=block.grace_s)
    if problem is not None:
        raise ValueError(f"backend slurm: {problem}")
    return SlurmBackend(settings.store, block)


slurm_backend.settings_key = "slurm"  # type: ignore[attr-defined]
slurm_backend.settings_type = SlurmSettings  # type: ignore[attr-defined]
