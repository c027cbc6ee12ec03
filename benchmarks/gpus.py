"""gpus: the local service hands out real GPUs, for anyone with an NVIDIA GPU to run.

    python -m benchmarks.gpus [--seconds S]

Starts a local service in a temporary directory (it finds the GPUs as a user's service would:
its `CUDA_VISIBLE_DEVICES`, else `nvidia-smi`) and runs two `command` tasks of `gpus: 1` side
by side. Each allocates 256 MiB on the device it sees through the CUDA driver (`libcuda` by
ctypes: no framework needed), holds it `--seconds`, and writes the `CUDA_VISIBLE_DEVICES` it got,
the device's name and PCI bus id, and when it held the memory. The script prints what each saw
and whether the two held their GPU at the same time: with two GPUs or more they run at once on
different devices; with one, the second waits for the first. It exits 1 when what it saw breaks
that, and 2 (saying why) on a machine without an NVIDIA GPU. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.service import start_service, stop_service
from simrun_api.backends.local_gpus import local_gpus

ALLOCATE = r"""
import ctypes, json, os, pathlib, sys, time
out, seconds = pathlib.Path(sys.argv[1]), float(sys.argv[2])
cuda = ctypes.CDLL("libcuda.so.1")
def check(result, what):
    if result != 0:
        raise SystemExit(f"{what} failed with CUDA error {result}")
check(cuda.cuInit(0), "cuInit")
count = ctypes.c_int()
check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
name = ctypes.create_string_buffer(256)
check(cuda.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
bus = ctypes.create_string_buffer(64)
check(cuda.cuDeviceGetPCIBusId(bus, 64, device), "cuDeviceGetPCIBusId")
context = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
memory = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(memory), 256 * 1024 * 1024), "cuMemAlloc")
start = time.time()
time.sleep(seconds)
end = time.time()
cuda.cuMemFree_v2(memory)
cuda.cuCtxDestroy_v2(context)
out.joinpath("gpu.json").write_text(json.dumps(dict(
    cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), devices_seen=count.value,
    name=name.value.decode(), pci_bus=bus.value.decode(), start=start, end=end)))
"""
"""A task's program: 256 MiB on its first visible device, held `seconds`, and what it saw."""


def workflow(seconds: float) -> dict[str, object]:
    """Two `command` tasks of one GPU each, running `ALLOCATE`."""

    def task(task_id: str) -> dict[str, object]:
        literal = ALLOCATE.replace("{", "{{").replace("}", "}}")  # no placeholder of args
        args = [sys.executable, "-c", literal, "{out}", str(seconds)]
        settings = {"image": "none", "args": args, "cores": 1, "memory_gb": 1.0, "gpus": 1}
        return {"id": task_id, "type": "command", "settings": settings}

    return {"name": "gpus", "tasks": [task("first"), task("second")]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each holds its GPU")
    options = parser.parse_args(argv)
    gpus = local_gpus()
    if not gpus:
        print(
            "gpus: no NVIDIA GPU here (no CUDA_VISIBLE_DEVICES, nvidia-smi lists none): "
            "nothing to show",
            file=sys.stderr,
        )
        return 2
    print(f"GPUs of this machine for the service: {', '.join(gpus)}")
    with tempfile.TemporaryDirectory(prefix="simrun-gpus-") as scratch:
        service = start_service(Path(scratch))
        try:
            servers = service.client.get("/servers").json()
            print(f"GET /servers: {[(s['name'], s['gpus']) for s in servers]}")
            response = service.client.post("/runs", json={"workflow": workflow(options.seconds)})
            if response.status_code != 201:
                print(f"the run was refused: {response.text}", file=sys.stderr)
                return 1
            run = response.json()["id"]
            timeout = 4 * options.seconds + 120
            view = service.client.get(f"/runs/{run}/wait", params={"timeout": timeout}).json()
            tasks = Path(scratch) / ".simrun" / "store" / "runs" / run / "tasks"
            if view["state"] != "succeeded":
                print(f"run {run}: {view['state']}: {view.get('message')}")
                for task in ("first", "second"):
                    print(service.client.get(f"/runs/{run}/logs/{task}").text[-2000:])
                return 1
            seen = {
                task: json.loads((tasks / task / "out" / "gpu.json").read_text())
                for task in ("first", "second")
            }
        finally:
            stop_service(service)
    for task, found in seen.items():
        print(
            f"{task}: CUDA_VISIBLE_DEVICES={found['cuda_visible_devices']!r}, sees "
            f"{found['devices_seen']} device(s), allocated on {found['name']} "
            f"({found['pci_bus']}) for {found['end'] - found['start']:.1f} s"
        )
    first, second = seen["first"], seen["second"]
    together = first["start"] < second["end"] and second["start"] < first["end"]
    print(f"held at the same time: {together}")
    problems = [
        f"{t} sees {f['devices_seen']} devices" for t, f in seen.items() if f["devices_seen"] != 1
    ]
    if together and first["pci_bus"] == second["pci_bus"]:
        problems.append("both held the same GPU at once")
    if len(gpus) == 1 and together:
        problems.append("with one GPU the second did not wait for the first")
    if len(gpus) > 1 and first["pci_bus"] == second["pci_bus"]:
        problems.append(f"{len(gpus)} GPUs but both tasks got the same one")
    for problem in problems:
        print(f"WRONG: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
