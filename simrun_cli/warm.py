"""The warm command process of a project directory: `simrun` commands run in forks of a process
that has imported what they need.

A command that uses the local service of its directory (`--local`) and finds it running starts one
in the background (`start_warm`); it listens on `.simrun/commands.sock` (mode 0600, only this user's
processes are served) and lives as long as that service. For each request of the console script
(`simrun_cli.entry`) it forks: the fork takes the command's standard streams, directory, environment
and arguments and runs the command line `simrun_cli.entry` handed over (`CommandLine`; this module
imports nothing of it), and the warm process reports how it ended. A request from another python,
another `sys.path`, or after a file of an imported module changed (an upgrade, an edit of an
editable install) is refused, and the process ends: the command runs by itself and starts a warm
process of the new code. The process also ends when its socket is replaced or removed; the commands
it runs are left to end.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simrun_cli import warm_wire

CHECK_S = 1.0
"""How often the process checks that its socket and its service are still there."""
REQUEST_TIMEOUT_S = 5.0
LOG = ".simrun/warm.log"
PRELOADED = (
    "simrun_cli.client",
    "simrun_cli.connect",
    "simrun_cli.download",
    "simrun_cli.follow",
    "simrun_cli.local",
    "simrun_cli.provenance",
    "simrun_cli.render",
    "simrun_cli.request",
    "simrun_cli.snapshots",
    "simrun_core.workflow",
    "simrun_core.wire",
    "simrun_core.environment",
    "simrun_core.task_types",
    "simrun_core.task_types.demo",
    "yaml",
    "importlib.metadata",
    "tomllib",
    "csv",
    "encodings.idna",
    "rich._emoji_codes",
)
"""What the commands import when they run (besides `CommandLine.preload`), imported once here:
not the modules of other distributions' task types, whose edits the warm process would not see
(`_module_stamps`)."""
OWN_PACKAGES = ("simrun_cli", "simrun_core", "simrun_api", "simrun_harness")
in_fork = False
"""Whether this process is a fork of the warm process running a command."""


@dataclass(frozen=True)
class CommandLine:
    """What the warm process runs, handed over by `simrun_cli.entry`, which starts it: the
    command line sits above this module and is not imported by it."""

    run: Callable[[list[str]], int]
    """The exit code of a command line, once its command returned (`simrun_cli.main.run`)."""
    preload: Callable[[], None]
    """Import what the commands import, once, before the first fork."""
    finish: Callable[[], None]
    """What a python of its own does at its end before its teardown (the `atexit` handlers, the
    streams flushed)."""
    interrupted: int
    """The exit code of a command interrupted (Ctrl-C) before it began."""


def start_warm(root: Path, service_pid: int) -> None:
    """Start the warm process of `root` for the service `service_pid` in the background, unless
    one answers on its socket; with this process's python, `sys.path` and environment.

    The socket is bound here and handed over, so it answers at once: a command that comes while
    the warm process still imports waits for it rather than starting another."""
    if os.environ.get("SIMRUN_WARM") == "0" or not hasattr(os, "pidfd_open"):
        return
    if _answers(root / warm_wire.SOCKET):
        return
    listener, identity = _bound(root)
    code = (
        "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
        "import simrun_cli.entry; simrun_cli.entry.serve_warm()"
    )
    try:
        with open(root / LOG, "ab") as log:
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    code,
                    json.dumps(sys.path),
                    json.dumps([service_pid, listener.fileno(), *identity]),
                ],
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                pass_fds=(listener.fileno(),),
            )
    finally:
        listener.close()


def _bound(root: Path) -> tuple[socket.socket, tuple[int, int]]:
    """A socket listening on `.simrun/commands.sock` of `root`, put there in one step, and the
    identity (device, inode) of its file there."""
    path = root / warm_wire.SOCKET
    mine = path.with_name(f"{path.name}.{os.getpid()}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.path.relpath(mine))
        os.chmod(mine, 0o600)
        listener.listen(64)
        status = os.stat(mine)
        os.replace(mine, path)
    except BaseException:
        listener.close()
        mine.unlink(missing_ok=True)
        raise
    return listener, (status.st_dev, status.st_ino)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def main(command_line: CommandLine) -> None:
    """`python -c ... SYS_PATH [SERVICE_PID, LISTENER_FD, DEVICE, INODE]` in the project
    directory (see `start_warm`), running `command_line`. The socket is removed at the end if it is
    still this one."""
    service_pid, fileno, device, inode = json.loads(sys.argv[2])
    listener = socket.socket(fileno=fileno)
    identity = (device, inode)
    try:
        _preload(command_line)
        from simrun_cli.local import prepare_probe_client, verify_service

        info = verify_service(Path.cwd())
        if info is None or info.pid != service_pid:
            _log(f"warm process {os.getpid()}: the service {service_pid} does not run")
            return
        prepare_probe_client()
        gc.collect()
        gc.freeze()  # the forks do not touch (and so copy) the pages of these objects
        Warm(command_line, service_pid, identity).serve(listener)
    finally:
        listener.close()
        _release(identity)


def _preload(command_line: CommandLine) -> None:
    import importlib

    command_line.preload()
    for name in PRELOADED:
        importlib.import_module(name)
    from rich.cells import cell_len

    cell_len("表")  # its tables of character widths


@dataclass
class Command:
    """A command running in a fork, and the connection of the `simrun` process that asked."""

    pid: int
    pidfd: int
    sock: socket.socket | None
    pair: socket.socket
    """The warm process's end of the pair the fork got its request on and tells its end on."""


@dataclass
class Spare:
    """A fork made ahead of the next request, waiting for it on its end of a socket pair: a
    request does not wait for a fork (several ms for a process of this size)."""

    pid: int
    pidfd: int
    pair: socket.socket


@dataclass
class Warm:
    """The loop of the warm process: accept requests, hand them to a spare fork, report ends."""

    command_line: CommandLine
    service_pid: int
    identity: tuple[int, int]
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    commands: dict[int, Command] = field(default_factory=dict)
    listener: socket.socket | None = None
    spare: Spare | None = None
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)

    def serve(self, listener: socket.socket) -> None:
        """Listen until the service ends or the socket is no longer this process's, then report
        the ends of the commands still running and return."""
        try:
            service = os.pidfd_open(self.service_pid)
        except OSError:
            return  # the service ended already
        self.selector.register(service, selectors.EVENT_READ, "service")
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        self.stamps = _module_stamps()
        self.spare = self._fork_spare()
        _log(f"warm process {os.getpid()} of the service {self.service_pid}")
        while self.listener is not None or self.commands:
            for key, _ in self.selector.select(CHECK_S):
                what = key.data
                if what == "service":
                    self._stop_listening()
                    self.selector.unregister(service)
                elif what == "listener" and self.listener is not None:
                    self._accept()
                elif isinstance(what, tuple):
                    kind, pid = what
                    (self._ended if kind == "pidfd" else self._hung_up)(pid)
            if self.listener is not None and not _owns(self.identity):
                self._stop_listening()
        self._drop_spare()

    def _stop_listening(self) -> None:
        if self.listener is None:
            return
        _release(self.identity)
        self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            sock.settimeout(REQUEST_TIMEOUT_S)
            request, fds = warm_wire.Channel(sock).receive(max_fds=warm_wire.STREAMS)
            if request is None:  # a probe: does the process answer?
                sock.close()
                return
            refusal = self._refusal(sock, request, fds)
            if refusal is not None:
                _log(f"refused: {refusal}")
                if refusal.startswith("stale"):  # before the answer: the command starts another
                    self._stop_listening()
                warm_wire.send(sock, {"refused": refusal})
                sock.close()
                return
            spare, self.spare = self.spare or self._fork_spare(), None
            warm_wire.send(sock, {"pid": spare.pid})
            warm_wire.send(spare.pair, request, fds=[*fds, sock.fileno()])
        except (OSError, warm_wire.WireError):
            sock.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        _log(f"{spare.pid}: {' '.join(request['argv'][1:])}")
        sock.setblocking(False)
        self.commands[spare.pid] = Command(spare.pid, spare.pidfd, sock, spare.pair)
        self.selector.register(spare.pidfd, selectors.EVENT_READ, ("pidfd", spare.pid))
        self.selector.register(sock, selectors.EVENT_READ, ("sock", spare.pid))
        self.spare = self._fork_spare()

    def _refusal(self, sock: socket.socket, request: dict[str, Any], fds: list[int]) -> str | None:
        """Why a request is not run here; None to run it."""
        if not warm_wire.same_user(sock):
            return "another user"
        if len(fds) != warm_wire.STREAMS:
            return "no request with the standard streams"
        if request.get("executable") != sys.executable or request.get("path") != sys.path:
            return "another python or sys.path"
        if _changed(self.stamps):
            return "stale: a module of the warm process changed"
        return None

    def _ended(self, pid: int) -> None:
        """Report the end of a command to its `simrun` process, if the command did not."""
        command = self.commands.pop(pid, None)
        if command is None:
            return
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _log(f"{pid}: exit {code}")
        self.selector.unregister(command.pidfd)
        os.close(command.pidfd)
        command.pair.close()
        if command.sock is not None:
            self.selector.unregister(command.sock)
            with contextlib.suppress(OSError):
                command.sock.setblocking(True)
                warm_wire.send(command.sock, {"exit": code})
            command.sock.close()

    def _hung_up(self, pid: int) -> None:
        """The `simrun` process of a command went away (killed): end its command too."""
        command = self.commands.get(pid)
        if command is None or command.sock is None:
            return
        self.selector.unregister(command.sock)
        command.sock.close()
        command.sock = None
        if not _told_end(command.pair):
            _terminate(pid)

    def _fork_spare(self) -> Spare:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            # A signal passed on before the command runs waits for it (see `_run_command`).
            signal.pthread_sigmask(signal.SIG_BLOCK, warm_wire.FORWARDED)
            ours.close()
            self._run_spare(theirs)
        theirs.close()
        return Spare(pid, os.pidfd_open(pid), ours)

    def _drop_spare(self) -> None:
        """End the spare fork: its end of the pair closes, it exits without a command."""
        if self.spare is not None:
            self.spare.pair.close()
            os.waitpid(self.spare.pid, 0)
            os.close(self.spare.pidfd)
            self.spare = None

    def _run_spare(self, pair: socket.socket) -> None:
        """In the spare fork: wait for a request, become its command's process and run it, tell
        its `simrun` process the exit code; never returns."""
        code = 1
        try:
            self.selector.close()
            if self.listener is not None:
                self.listener.close()
            for command in self.commands.values():
                os.close(command.pidfd)
                command.pair.close()
                if command.sock is not None:
                    command.sock.close()
            request, fds = warm_wire.Channel(pair).receive(max_fds=warm_wire.STREAMS + 1)
            if request is None:
                os._exit(0)
            global in_fork
            in_fork = True
            *streams, connection = fds
            sock = socket.socket(fileno=connection)
            _take_streams(streams, request["streams"])
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            time.tzset()  # the command's TZ, for the times it prints
            os.umask(request["umask"])
            sys.argv = list(request["argv"])
            _take_signals(request.get("ignored", []))
            code = _run_command(self.command_line, sys.argv[1:])
            with contextlib.suppress(OSError):  # first to the warm process: see `_hung_up`
                warm_wire.send(pair, {"exit": code})
                warm_wire.send(sock, {"exit": code})
        except BaseException:  # the fork never returns into the loop
            traceback.print_exc()
        finally:
            os._exit(code)


def _owns(identity: tuple[int, int]) -> bool:
    """Whether `.simrun/commands.sock` is still the file of the socket of `identity`."""
    try:
        status = os.stat(warm_wire.SOCKET)
    except OSError:
        return False
    return (status.st_dev, status.st_ino) == identity


def _release(identity: tuple[int, int]) -> None:
    """Remove `.simrun/commands.sock` if it is still the file of the socket of `identity`."""
    if _owns(identity):
        with contextlib.suppress(OSError):
            os.unlink(warm_wire.SOCKET)


def _log(line: str) -> None:
    """A line of `.simrun/warm.log` (this process's stdout): a command it runs, how one ended."""
    print(line, flush=True)


def _told_end(pair: socket.socket) -> bool:
    """Whether the fork of a command said on its pair that the command ended."""
    pair.setblocking(False)
    try:
        return bool(pair.recv(1))
    except OSError:
        return False


def _terminate(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)


def _take_signals(ignored: list[int]) -> None:
    """The handlers of a python of its own (whatever the warm process was started with), but
    for the signals the command's caller ignores."""
    for signum in warm_wire.FORWARDED:
        if signum in ignored:
            signal.signal(signum, signal.SIG_IGN)
        elif signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
        else:
            signal.signal(signum, signal.SIG_DFL)


def _run_command(command_line: CommandLine, tokens: list[str]) -> int:
    """Run the command as a python of its own does: its exit code, after the other threads it
    started and the handlers of `atexit` (the fork tells its `simrun` process its code before it
    ends)."""
    code: Any = 0
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, warm_wire.FORWARDED)
        code = command_line.run(tokens)
    except SystemExit as end:
        code = end.code
    except KeyboardInterrupt:  # Ctrl-C before the command began
        code = command_line.interrupted
    except BaseException:
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    command_line.finish()
    return int(code)


_REPLACED_STREAMS: list[tuple[Any, ...]] = []


def _take_streams(fds: list[int], forms: list[dict[str, Any]]) -> None:
    """Make the command's stdin, stdout and stderr this process's, set up as they were there."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd >= warm_wire.STREAMS:
            os.close(fd)
    # The streams of the warm process stay referenced: freed, they would close fds 0-2.
    _REPLACED_STREAMS.append(
        (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
    )
    modes = ("rb", "wb", "wb")
    streams = []
    for target, (mode, form) in enumerate(zip(modes, forms, strict=True)):
        binary = open(target, mode, closefd=False)  # noqa: SIM115 - the process's own stream
        streams.append(
            io.TextIOWrapper(
                binary,
                encoding=form["encoding"],
                errors=form["errors"],
                line_buffering=form["line_buffering"],
                write_through=form["write_through"],
            )
        )
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def _changed(stamps: dict[str, tuple[int, int]]) -> bool:
    """Whether a file of `_module_stamps()` is no longer as it was."""
    return any(_stamp(path) != stamp for path, stamp in stamps.items())


def _stamp(path: str) -> tuple[int, int]:
    """The mtime (ns) and size of a file, (-1, -1) for one that is not there."""
    try:
        status = os.stat(path)
    except OSError:
        return (-1, -1)
    return (status.st_mtime_ns, status.st_size)


def _module_stamps() -> dict[str, tuple[int, int]]:
    """The mtime and size of the file of every imported module of simrun and of every directory
    on `sys.path`: what an edit of simrun's code (an editable install) or a change of the
    installed distributions (one added, removed or upgraded, so their code and task types)
    changes. (An edit in place of another distribution's files is not seen.)"""
    files = [
        getattr(module, "__file__", None)
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] in OWN_PACKAGES
    ]
    return {path: _stamp(path) for path in [*files, *sys.path] if isinstance(path, str)}
