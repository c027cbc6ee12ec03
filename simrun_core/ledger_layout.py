"""The layout of a split task's ledger, `<task_dir>/ledger/`: its one definition.

The harness writes the ledger (`simrun_harness.ledger`, which documents why it is built so);
the service reads the claims of its workers (`simrun_api.workers`). Pure: names, no I/O.

- `size`: the number of units.
- `claim/<shard>/<index>.<epoch>`: a claim of a unit, naming the worker that holds it.
- `release/<shard>/<index>.<epoch>`: the release of that claim.
- `done/<shard>/<index>`: the unit is computed.
- `heartbeats/<worker>`: touched by each worker; its mtime is the heartbeat.

`<shard>` is `index // 1000` (`SHARD_UNITS`). Each entry but `size` and the heartbeats is a
symbolic link whose target is a worker id (`WORKER_ID`).
"""

from __future__ import annotations

import re
from typing import Final

SHARD_UNITS: Final = 1000
"""The units of one shard directory."""

SIZE: Final = "size"
CLAIM: Final = "claim"
RELEASE: Final = "release"
DONE: Final = "done"
HEARTBEATS: Final = "heartbeats"

WORKER_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A worker id: it names ledger entries and files, so no '/' and no leading '.'."""

_ENTRY_NAME: Final = re.compile(r"([0-9]+)(?:\.([0-9]+))?")


def shard(index: int, shard_units: int = SHARD_UNITS) -> int:
    """The shard directory of a unit: `index // shard_units`."""
    return index // shard_units


def epoch_name(index: int, epoch: int) -> str:
    """The name of a claim or release of a unit's epoch, `<index>.<epoch>`."""
    return f"{index}.{epoch}"


def claim_path(index: int, epoch: int, shard_units: int = SHARD_UNITS) -> str:
    """The claim of a unit's epoch below the ledger, `claim/<shard>/<index>.<epoch>`."""
    return f"{CLAIM}/{shard(index, shard_units)}/{index}.{epoch}"


def release_path(index: int, epoch: int, shard_units: int = SHARD_UNITS) -> str:
    """The release of a unit's epoch below the ledger, `release/<shard>/<index>.<epoch>`."""
    return f"{RELEASE}/{shard(index, shard_units)}/{index}.{epoch}"


def done_path(index: int, shard_units: int = SHARD_UNITS) -> str:
    """The mark of a computed unit below the ledger, `done/<shard>/<index>`."""
    return f"{DONE}/{shard(index, shard_units)}/{index}"


def heartbeat_path(worker: str) -> str:
    """The heartbeat of a worker below the ledger, `heartbeats/<worker>`."""
    return f"{HEARTBEATS}/{worker}"


def parse_entry(name: str) -> tuple[int, int | None] | None:
    """The unit and epoch an entry's name holds (`<index>.<epoch>`, or `<index>` of `done/`
    with epoch None); None for a name of neither form."""
    match = _ENTRY_NAME.fullmatch(name)
    if match is None:
        return None
    return int(match[1]), None if match[2] is None else int(match[2])


def in_its_shard(name: str, shard_name: str, shard_units: int = SHARD_UNITS) -> bool:
    """Whether an entry lies in the shard directory of its unit; the ledger never looks up one
    that does not, so a reader must not count it either."""
    entry = parse_entry(name)
    return (
        entry is not None
        and shard_name.isdigit()
        and shard(entry[0], shard_units) == int(shard_name)
    )
