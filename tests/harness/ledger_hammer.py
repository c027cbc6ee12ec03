"""A worker that hammers a ledger, for the exclusivity test: ROOT N WORKER SEED.

It claims units as fast as it can, releases some at random (so units are claimed again,
at higher epochs) and completes the rest. Independently of the ledger it checks exclusivity:
while it holds a unit it owns `<root>/../holders/<index>`, created exclusively; finding that
file taken means two workers hold one unit at once. Prints a JSON line of its counts.
"""

import json
import os
import random
import sys
import time
from pathlib import Path

from simrun_harness.ledger import Ledger


def main() -> int:
    root, n_units, worker, seed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = random.Random(seed)
    holders = root.parent / "holders"
    (root.parent / "ready" / worker).touch()
    while not (root.parent / "go").exists():
        time.sleep(0.001)
    ledger = Ledger(root, n_units)
    ledger.heartbeat(worker)
    claims = releases = violations = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        index = ledger.claim(worker)
        if index is None:
            if ledger.refresh():
                continue
            if ledger.complete_ledger():
                break
            time.sleep(0.001)
            continue
        claims += 1
        holder = holders / str(index)
        try:
            os.close(os.open(holder, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            violations += 1
            continue
        if rng.random() < 0.3:
            holder.unlink()
            ledger.release(index, worker)
            releases += 1
        else:
            holder.unlink()
            ledger.complete(index, worker)
    print(json.dumps({"claims": claims, "releases": releases, "violations": violations}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
