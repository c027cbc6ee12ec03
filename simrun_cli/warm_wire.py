"""What a `simrun` command and the warm command process of its directory say to each other.

Only modules built into the interpreter (`_signal`, `_socket`, `marshal`): the command imports this
module before it knows whether it runs the command itself, and `socket`, `json` and `signal` would
take ~8 ms of its start. A message is a 4-byte big-endian length and that many bytes of `marshal`
(dicts of str, int, bool, None and lists; both ends run the same python, and each end checks that
the other runs as its user before it reads a message); the request carries the command's standard
streams as file descriptors (SCM_RIGHTS).

    command -> warm: {"argv", "cwd", "env", "path", "executable", "streams", "ignored",
                      "umask"} + fds 0, 1, 2
    warm -> command: {"pid": PID} (the process that runs it) or {"refused": WHY}
    warm -> command: {"exit": CODE} when the command ended (-N: killed by signal N)
"""

from __future__ import annotations

import _signal
import _socket
import marshal
import os
import sys
from typing import Any

SOCKET = ".simrun/commands.sock"
"""The socket of the warm process, relative to the project directory (a command's cwd), so the
length of the directory's path never exceeds the limit of a socket's address."""
HEADER = 4
MAX_MESSAGE = 16 * 1024 * 1024
STREAMS = 3
FD_BYTES = 4
"""The size of a C int: the file descriptors of SCM_RIGHTS."""
CREDENTIALS = 12
"""The size of `struct ucred` (pid, uid, gid) of SO_PEERCRED."""
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGWINCH)
"""The signals a `simrun` process passes on to the process running its command; a fork of the
warm process blocks them until its command runs."""


class WireError(Exception):
    """The other side broke the protocol or went away in the middle of a message."""


def peer_uid(sock: _socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket."""
    credentials = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, CREDENTIALS)
    return int.from_bytes(credentials[4:8], sys.byteorder)


def same_user(sock: _socket.socket) -> bool:
    """Whether the other end of `sock` runs as this process's user."""
    return peer_uid(sock) == os.getuid()


def send(sock: _socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one message, with `fds` attached to its first byte."""
    body = marshal.dumps(message)
    data = len(body).to_bytes(HEADER, "big") + body
    if fds:
        rights = b"".join(fd.to_bytes(FD_BYTES, sys.byteorder) for fd in fds)
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        data = data[sent:]
    if data:
        sock.sendall(data)


class Channel:
    """The messages arriving on a socket, read through a buffer (one read may hold several)."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def receive(self, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
        """The next message and the file descriptors that came with it; (None, []) at a clean
        end of the other side."""
        fds: list[int] = []
        if not self._buffer:
            self._buffer, fds = self._read(max_fds)
            if not self._buffer:
                return None, fds
        self._fill(HEADER)
        length = int.from_bytes(self._buffer[:HEADER], "big")
        if length > MAX_MESSAGE:
            raise WireError(f"a message of {length} bytes")
        self._fill(HEADER + length)
        body = self._buffer[HEADER : HEADER + length]
        self._buffer = self._buffer[HEADER + length :]
        try:
            message = marshal.loads(body)
        except (EOFError, ValueError, TypeError) as error:
            raise WireError(f"a message that cannot be read: {error}") from None
        if not isinstance(message, dict):
            raise WireError("a message that is not a dict")
        return message, fds

    def _read(self, max_fds: int) -> tuple[bytes, list[int]]:
        if not max_fds:
            return self.sock.recv(65536), []
        data, ancillary, _, _ = self.sock.recvmsg(65536, _socket.CMSG_SPACE(max_fds * FD_BYTES))
        fds = []
        for level, kind, rights in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                usable = len(rights) - len(rights) % FD_BYTES
                fds += [
                    int.from_bytes(rights[at : at + FD_BYTES], sys.byteorder)
                    for at in range(0, usable, FD_BYTES)
                ]
        return data, fds

    def _fill(self, size: int) -> None:
        while len(self._buffer) < size:
            data = self.sock.recv(65536)
            if not data:
                raise WireError("the other side ended in the middle of a message")
            self._buffer += data
