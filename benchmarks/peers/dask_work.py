"""The work in Dask: futures on a LocalCluster of one single-threaded process per core.

    python dask_work.py check                                 # exits 0 when dask imports
    python dask_work.py serve                                 # the cluster, until stdin closes
    python dask_work.py squares UNITS SLEEP_S OUT ADDRESS     # one work against it
    python dask_work.py chain TASKS SLEEP_S OUT ADDRESS

`serve` starts the cluster (as simrun's service runs before `simrun submit`) and prints
`{"address": ...}`; a work is a fresh python that imports distributed, connects a Client to
the cluster, runs the work and prints its phases (`work.figures`). Exits `work.MISSING_EXIT`
when distributed cannot be imported.
"""

from __future__ import annotations

import json
import os
import sys

import work


def serve() -> None:
    """Run a LocalCluster until stdin closes; print its address first."""
    try:
        from distributed import LocalCluster
    except ImportError as error:
        work.missing("dask", error)
    cores = len(os.sched_getaffinity(0))
    with LocalCluster(
        n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        print(json.dumps({"address": cluster.scheduler_address}), flush=True)
        sys.stdin.read()


def run(job: work.Work) -> None:
    """Run the work on the cluster at `job.address`; print its phases."""
    try:
        import cloudpickle
        from distributed import Client
    except ImportError as error:
        work.missing("dask", error)
    imported = work.time.perf_counter()
    cloudpickle.register_pickle_by_value(work)
    out = str(job.out)
    with Client(job.address) as client:
        connected = work.time.perf_counter()
        if job.kind == "squares":
            units = client.map(
                work.compute_unit, [out] * job.count, range(job.count), [job.sleep_s] * job.count
            )
            client.submit(work.sum_units, out, job.count, units).result()
        else:
            previous = client.submit(work.chain_task, out, 1, job.sleep_s)
            for number in range(2, job.count + 1):
                previous = client.submit(work.chain_task, out, number, job.sleep_s, previous)
            previous.result()
        done = work.time.perf_counter()
    work.check(job)
    work.figures(
        imports_s=imported - work.STARTED, connect_s=connected - imported, work_s=done - connected
    )


def check() -> None:
    """Exit 0 when distributed imports, `work.MISSING_EXIT` when it does not."""
    try:
        import distributed  # noqa: F401
    except ImportError as error:
        work.missing("dask", error)


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        check()
    elif sys.argv[1:] == ["serve"]:
        serve()
    else:
        run(work.parse_work(sys.argv[1:]))
