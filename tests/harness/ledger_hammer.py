"""A worker that hammers a ledger, for the exclusivity test: ROOT N WORKER SEED.

It claims one to three units at a time as fast as it can, then for each either completes it,
releases it, or (now and then) "restarts": a new `Ledger` object releases all it holds, as a
restarted worker does. Now and then it also releases stale claims as a coordinator would,
which must release nothing, since every hammer's heartbeat is fresh.

Independently of the ledger's own bookkeeping it records what it held: for each claim the
epoch found on disk (the first epoch of the unit without a release, whose file must name this
worker), and while it holds a unit it owns `<root>/../holders/<index>`, created exclusively, so
two holders of one unit at once find that file taken. At the end it prints one JSON object:
its claims as [index, epoch], its releases and completes, and the violations it saw.
"""

import json
import os
import random
import sys
import time
from pathlib import Path

from simrun_harness.ledger import Ledger

STALE_S = 60.0


def entry(root: Path, kind: str, index: int, epoch: int) -> Path:
    """The claim or release of a unit's epoch: a link in the shard of 1,000 units of its index."""
    return root / kind / str(index // 1000) / f"{index}.{epoch}"


def live_epoch(root: Path, index: int) -> int | None:
    """The epoch of the unit's claim without a release, read from the files alone."""
    epoch = 0
    while entry(root, "claim", index, epoch).is_symlink():
        if not entry(root, "release", index, epoch).is_symlink():
            return epoch
        epoch += 1
    return None


def main() -> int:
    root, n_units, worker, seed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = random.Random(seed)
    holders = root.parent / "holders"
    (root.parent / "ready" / worker).touch()
    while not (root.parent / "go").exists():
        time.sleep(0.001)
    ledger = Ledger(root, n_units)
    ledger.heartbeat(worker)
    claims: list[tuple[int, int]] = []
    releases: list[tuple[int, int]] = []
    completes: list[int] = []
    violations: list[str] = []
    restarts = stale_checks = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held: dict[int, int] = {}
        for _ in range(rng.randint(1, 3)):
            index = ledger.claim(worker)
            if index is None:
                break
            epoch = live_epoch(root, index)
            if epoch is None or os.readlink(entry(root, "claim", index, epoch)) != worker:
                violations.append(f"claimed {index} but its live claim is {epoch}, not mine")
                continue
            claims.append((index, epoch))
            try:
                os.close(os.open(holders / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                violations.append(f"unit {index} (epoch {epoch}) has another holder")
                continue
            held[index] = epoch
        if not held:
            if ledger.refresh():
                continue
            if ledger.complete_ledger():
                break
            time.sleep(0.001)
            continue
        if rng.random() < 0.05:
            for index in held:
                (holders / str(index)).unlink()
            ledger = Ledger(root, n_units)  # a restart: the new incarnation releases all
            released = ledger.release_all(worker)
            if released != sorted(held):
                violations.append(f"the restart released {released}, not {sorted(held)}")
            releases.extend(held.items())
            restarts += 1
            continue
        if rng.random() < 0.05:
            stale_checks += 1
            if stale := ledger.release_stale(STALE_S, worker):
                violations.append(f"released fresh claims as stale: {stale}")
        for index, epoch in held.items():
            (holders / str(index)).unlink()
            if rng.random() < 0.3:
                if not ledger.release(index, worker):
                    violations.append(f"the release of my claim {index}.{epoch} did nothing")
                releases.append((index, epoch))
            else:
                ledger.complete(index, worker)
                completes.append(index)
    facts = {
        "claims": claims,
        "releases": releases,
        "completes": completes,
        "restarts": restarts,
        "stale_checks": stale_checks,
        "violations": violations,
    }
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
