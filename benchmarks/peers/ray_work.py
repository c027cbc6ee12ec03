"""The work in Ray: remote functions on a local Ray of as many CPUs as the machine's cores.

    python ray_work.py check                                 # exits 0 when ray imports
    python ray_work.py serve TEMP_DIR                        # the cluster, until stdin closes
    python ray_work.py squares UNITS SLEEP_S OUT ADDRESS     # one work against it
    python ray_work.py chain TASKS SLEEP_S OUT ADDRESS

`serve` starts Ray (`ray.init(num_cpus=cores)`, as simrun's service runs before `simrun
submit`) and prints `{"address": ...}` (its GCS); a work is a fresh python that imports ray,
joins the cluster as a driver, runs the work and prints its phases (`work.figures`). Exits
`work.MISSING_EXIT` when ray cannot be imported.

The benchmark gives every process the same `RAY_AUTH_MODE=token` and a `RAY_AUTH_TOKEN` of its
own making, so Ray writes no token to ~/.ray, and the cluster's files go to TEMP_DIR, not /tmp.
"""

from __future__ import annotations

import json
import os
import sys

import work


def serve(temp_dir: str) -> None:
    """Run a local Ray with its files in `temp_dir` until stdin closes; print its address."""
    try:
        import ray
    except ImportError as error:
        work.missing("ray", error)
    cores = len(os.sched_getaffinity(0))
    context = ray.init(
        num_cpus=cores,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=temp_dir,
    )
    try:
        print(json.dumps({"address": context.address_info["gcs_address"]}), flush=True)
        sys.stdin.read()
    finally:
        ray.shutdown()


def run(job: work.Work) -> None:
    """Run the work on the Ray at `job.address`; print its phases."""
    try:
        import ray
        from ray import cloudpickle
    except ImportError as error:
        work.missing("ray", error)
    imported = work.time.perf_counter()
    cloudpickle.register_pickle_by_value(work)
    ray.init(address=job.address, log_to_driver=False, configure_logging=False)
    connected = work.time.perf_counter()
    out = str(job.out)
    if job.kind == "squares":
        unit = ray.remote(num_cpus=1)(work.compute_unit)
        total = ray.remote(num_cpus=1)(work.sum_units)
        units = [unit.remote(out, index, job.sleep_s) for index in range(job.count)]
        ray.get(total.remote(out, job.count, *units))
    else:
        task = ray.remote(num_cpus=1)(work.chain_task)
        previous = task.remote(out, 1, job.sleep_s)
        for number in range(2, job.count + 1):
            previous = task.remote(out, number, job.sleep_s, previous)
        ray.get(previous)
    done = work.time.perf_counter()
    ray.shutdown()
    work.check(job)
    work.figures(
        imports_s=imported - work.STARTED, connect_s=connected - imported, work_s=done - connected
    )


def check() -> None:
    """Exit 0 when ray imports, `work.MISSING_EXIT` when it does not."""
    try:
        import ray  # noqa: F401
    except ImportError as error:
        work.missing("ray", error)


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        check()
    elif sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    else:
        run(work.parse_work(sys.argv[1:]))
