"""The local pool of processes that compute the units of a split task.

Each process runs the type's `setup` once, when it starts (the pool's initializer), and then
`compute_unit` per unit, measuring each unit's wall and CPU seconds itself; the setup's seconds
count towards the first unit of the process. A setup that raises fails every unit of its
process with that error (a unit failure, exit 3), not the pool.

The processes are forked before the harness starts its threads (`UnitPool.start`), ignore
SIGTERM (the harness decides what a stop means, and the local backend signals the whole process
group) and die with the harness (`PR_SET_PDEATHSIG`, where Linux offers it).

A call of the pool computes a list of units one after the other (`submit`): the harness sends
short units several to a call, so the round trip of a call (a pickle and a pipe each way, and
the executor's threads) is paid once for them. It answers a `CallResult`: the units computed,
the first that failed (with the traceback in its process), and the ones not begun after it. The
harness submits more calls than there are processes, so a process finds its next call waiting
when it ends one. After `stop_starting` a process begins no further unit: the rest of its call,
and every call it takes then, come back not begun, untouched, for the harness to release.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import multiprocessing
import os
import pickle
import signal
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, NamedTuple

from simrun_core.plugins import TaskPaths, TaskType, resolve

_PR_SET_PDEATHSIG = 1


class UnitResult(NamedTuple):
    """A computed unit: its index and the wall and CPU seconds it took in its process, the
    setup's included for the first unit of a process (`setup_seconds` of them)."""

    index: int
    seconds: float
    cpu_seconds: float
    setup_seconds: float = 0.0


class RemoteTraceback(Exception):
    """The traceback of a unit's error in its process, set as the error's `__cause__`."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


class UnitFailure(NamedTuple):
    """A unit that raised in its process: the error and its traceback there."""

    index: int
    error: BaseException
    trace: str

    def cause(self) -> BaseException:
        """The error, its traceback in the process of the pool as its cause."""
        self.error.__cause__ = RemoteTraceback(self.trace)
        return self.error


class CallResult(NamedTuple):
    """What a call of the pool did with its units, in their order: the units computed, then
    the first that failed, if one did, then those it did not begin (after a failure or
    `stop_starting`)."""

    results: list[UnitResult]
    failure: UnitFailure | None
    not_begun: list[int]


class UnitPool:
    """A pool of `processes` processes computing units of one task."""

    def __init__(
        self, task_type: TaskType, settings: Any, paths: TaskPaths, processes: int
    ) -> None:
        if not task_type.splittable:
            raise ValueError(f"task type {task_type.name!r} is not split into units")
        self.processes = processes
        self._stopped = mmap.mmap(-1, 1)  # one shared byte, 1 after `stop_starting`
        self._executor = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_process,
            initargs=(task_type.setup, task_type.compute_unit, settings, paths, self._stopped),
        )

    def start(self) -> None:
        """Fork all processes now (a fork start launches them at the first submission)."""
        self._executor.submit(_nothing)

    def submit(self, indices: list[int]) -> Future[CallResult]:
        """Compute units one after the other in a process of the pool."""
        return self._executor.submit(_compute_units, indices)

    def stop_starting(self) -> None:
        """Begin no more units: those not begun yet come back at once, not begun."""
        self._stopped[0] = 1

    def pids(self) -> list[int]:
        """The pids of the processes of the pool."""
        processes = getattr(self._executor, "_processes", None) or {}
        return [process.pid for process in processes.values() if process.pid is not None]

    def close(self) -> None:
        """End the processes once the units are done, without waiting for them to exit (they
        have nothing left to do, and die with the harness at the latest)."""
        self._executor.shutdown(wait=False)

    def kill(self) -> None:
        """Kill the processes at once (SIGKILL; they ignore SIGTERM) and drop queued units."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._executor.shutdown(wait=True, cancel_futures=True)


# -- in the processes of the pool ------------------------------------------------------------

_process: dict[str, Any] = {}


def _start_process(
    setup_ref: str | None, compute_ref: str, settings: Any, paths: TaskPaths, stopped: mmap.mmap
) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    started, cpu_started = time.perf_counter(), time.process_time()
    _process.update(settings=settings, paths=paths, error=None, stopped=stopped)
    try:
        _process["compute"] = resolve(compute_ref)
        if setup_ref:
            resolve(setup_ref)(settings, paths)
    except Exception as error:
        _process["error"] = error
    _process["setup"] = (time.perf_counter() - started, time.process_time() - cpu_started)


def _die_with_parent() -> None:
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _nothing() -> None:
    return None


def _compute_units(indices: list[int]) -> CallResult:
    results = []
    for position, index in enumerate(indices):
        if _process["stopped"][0]:
            return CallResult(results, None, indices[position:])
        try:
            results.append(_compute(index))
        except Exception as error:
            return CallResult(results, _failure(index, error), indices[position + 1 :])
    return CallResult(results, None, [])


def _failure(index: int, error: Exception) -> UnitFailure:
    """The failure of a unit, its error replaced by one naming it when it cannot be pickled."""
    trace = "".join(traceback.format_exception(error))
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        error = RuntimeError(f"{type(error).__name__}: {error} (that error cannot be pickled)")
    error.__traceback__ = None
    return UnitFailure(index, error, trace)


def _compute(index: int) -> UnitResult:
    error = _process["error"]
    if error is not None:
        raise error
    setup_seconds, setup_cpu = _process.pop("setup", (0.0, 0.0))
    started, cpu_started = time.perf_counter(), time.process_time()
    _process["compute"](_process["settings"], index, _process["paths"])
    return UnitResult(
        index,
        time.perf_counter() - started + setup_seconds,
        time.process_time() - cpu_started + setup_cpu,
        setup_seconds,
    )
