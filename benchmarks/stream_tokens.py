"""The tokens of a benchmark's many event streams: a service allows an identity at most
`max_streams_per_identity` open streams (429 past it), so the streams of one benchmark are
spread over persons of their own, written into the project's tokens file before its service
starts."""

from __future__ import annotations

import getpass
import secrets
from pathlib import Path

from simrun_api.auth import write_tokens
from simrun_api.settings import ServiceSettings
from simrun_core.wire import Identity

STREAMS_PER_IDENTITY = ServiceSettings(
    store=Path(), db=Path(), tokens=Path(), owner="", web=None
).max_streams_per_identity
"""The streams an identity may have open in the local service (its default)."""


def write_stream_tokens(root: Path, streams: int) -> tuple[str, list[str]]:
    """Write the tokens file of the project in `root`: the user's and those of as many persons
    as `streams` streams need; the user's token and theirs (`stream_token` picks one)."""
    mine = secrets.token_urlsafe(32)
    others = [secrets.token_urlsafe(32) for _ in range(-(-streams // STREAMS_PER_IDENTITY))]
    tokens = {mine: Identity.person(getpass.getuser())}
    tokens.update({token: Identity.person(f"bench-{n}") for n, token in enumerate(others)})
    local = root / ".simrun"
    local.mkdir(parents=True, exist_ok=True)
    write_tokens(local / "tokens.yaml", tokens)
    return mine, others


def stream_token(tokens: list[str], stream: int) -> str:
    """The token of the `stream`-th stream: no identity holds more than it may."""
    return tokens[stream // STREAMS_PER_IDENTITY]
