"""The ways a harness run ends other than success, each with its exit code (`simrun_core.exits`)."""

from __future__ import annotations

from simrun_core import exits


class HarnessError(Exception):
    """An end of a harness run: its exit code, whether it counts as a failure, its message."""

    exit_code: int = exits.HARNESS_BUG
    failed = True


class ConfigurationError(HarnessError):
    """The environment or the settings of a task are wrong; the message names the variable."""

    exit_code = exits.CONFIGURATION


class UnitError(HarnessError):
    """A unit failed in the function of the task type; it was released."""

    exit_code = exits.FAILED

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"unit {index} failed: {type(cause).__name__}: {cause}")
        self.index = index
        self.cause = cause


class MergeError(HarnessError):
    """The units cannot be merged: some are not done, or the merge function failed."""

    exit_code = exits.FAILED


class CommandFailed(HarnessError):
    """The command of an unsplit task exited with an error."""

    exit_code = exits.FAILED


class Killed(HarnessError):
    """A process doing the work was killed (SIGKILL, e.g. by the out of memory killer).

    Not a failure of the task: it is retried, with more memory when the kernel killed for it.
    """

    exit_code = exits.KILLED
    failed = False


class Terminated(HarnessError):
    """The harness stopped on SIGTERM before its work was done; it is retried."""

    exit_code = exits.TERMINATED
    failed = False
