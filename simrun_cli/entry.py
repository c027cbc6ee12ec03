"""The `simrun` console script: the command runs in the warm command process of the directory when
one answers, else here.

Python with this machine's site, cyclopts, httpx and the structs of the wire take ~0.1-0.2 s to
start before any command does its work; the warm process (`simrun_cli.warm`) has them imported
and runs each command in a fork of itself, with this process's arguments, directory,
environment and standard streams, so the command is the same and only its start is shorter.
Before it knows which, this module imports only modules built into the interpreter (and
`simrun_cli.warm_wire`). The environment goes only to a warm process of this user. Signals that
would end this process (Ctrl-C, SIGTERM, SIGHUP) are passed on to the process running the
command (one this process ignores stays ignored there), and this process exits with its code.
`SIMRUN_WARM=0` runs every command here.
"""

from __future__ import annotations

import _signal
import _socket
import contextlib  # imported by the interpreter's start already
import os
import sys
from typing import Any

from simrun_cli import warm_wire

SERVING = ("serve", "edit")
"""The commands that run a server until stopped: in a python of their own, which ends as usual
(the finalizers of their objects run)."""


def main() -> None:
    """Run the command in the warm process of the directory if one takes it, else here."""
    warm = os.environ.get("SIMRUN_WARM") != "0" and hasattr(_socket, "SO_PEERCRED")
    if warm and not (len(sys.argv) > 1 and sys.argv[1] in SERVING):
        code = run_warm(sys.argv)
        if code is not None:
            _exit(code)
    from simrun_cli.main import main as run_here

    run_here()


def serve_warm() -> None:
    """The warm command process of the directory (started by `simrun_cli.warm.start_warm`): it
    runs the command line of `simrun_cli.main` in its forks."""
    from simrun_cli import main as cli
    from simrun_cli import warm

    warm.main(
        warm.CommandLine(
            run=cli.run,
            preload=cli.preload,
            finish=cli.run_exit_handlers,
            interrupted=cli.EXIT_INTERRUPTED,
        )
    )


def run_warm(argv: list[str]) -> int | None:
    """The exit code of the command run by the warm process; None when none takes it (no
    process, another python or version of simrun, a standard stream closed), before anything
    of the command ran."""
    streams = _streams()
    if streams is None:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    forwarder = Forwarder()
    try:
        try:
            sock.connect(warm_wire.SOCKET)
            if not warm_wire.same_user(sock):
                return None
            request = {
                "argv": argv,
                "cwd": os.getcwd(),
                "env": dict(os.environ),
                "path": sys.path,
                "executable": sys.executable,
                "streams": streams,
                "ignored": forwarder.ignored,
                "umask": _umask(),
            }
            warm_wire.send(sock, request, fds=list(range(warm_wire.STREAMS)))
            channel = warm_wire.Channel(sock)
            answer, _ = channel.receive()
        except (OSError, warm_wire.WireError):
            answer = None
        if answer is None or not isinstance(answer.get("pid"), int):
            forwarder.restore()
            return None
        forwarder.to(answer["pid"])
        return _wait(channel, answer["pid"])
    finally:
        sock.close()


class Forwarder:
    """Passes the signals of `warm_wire.FORWARDED` that this process does not ignore on to the
    process of the command, once it is known; until then they wait (or return to this process with
    `restore` when the command runs here after all)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.waiting: list[int] = []
        self.previous: dict[int, Any] = {}
        self.ignored: list[int] = []
        for signum in warm_wire.FORWARDED:
            previous = _signal.getsignal(signum)
            if previous is _signal.SIG_IGN:
                self.ignored.append(signum)
            else:
                self.previous[signum] = _signal.signal(signum, self._forward)

    def _forward(self, signum: int, _: Any) -> None:
        if self.pid is None:
            self.waiting.append(signum)
            return
        with contextlib.suppress(OSError):  # it has ended
            os.kill(self.pid, signum)

    def to(self, pid: int) -> None:
        self.pid = pid
        for signum in self.waiting:
            self._forward(signum, None)

    def restore(self) -> None:
        for signum, previous in self.previous.items():
            _signal.signal(signum, previous)
        for signum in self.waiting:
            os.kill(os.getpid(), signum)


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _streams() -> list[dict[str, Any]] | None:
    """How this process's stdin, stdout and stderr are set up, for the warm process to set up
    its own alike; None when one of them is closed."""
    forms = []
    for fd, stream in enumerate((sys.stdin, sys.stdout, sys.stderr)):
        try:
            os.fstat(fd)
        except OSError:
            return None
        if stream is None:
            return None
        forms.append(
            {
                "encoding": stream.encoding,
                "errors": stream.errors,
                "line_buffering": stream.line_buffering,
                "write_through": stream.write_through,
            }
        )
    return forms


def _wait(channel: warm_wire.Channel, pid: int) -> int:
    """The exit code of the command of `pid`, once the warm process or the command tells it."""
    try:
        end, _ = channel.receive()
    except (OSError, warm_wire.WireError):
        end = None
    if end is None or not isinstance(end.get("exit"), int):
        print(
            f"error: the warm command process ended before the command (pid {pid}) did; "
            "run it again",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return end["exit"]


def _exit(code: int) -> None:
    """Exit like the process that ran the command: with its code, or by its signal."""
    if code < 0:
        _signal.signal(-code, _signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)
