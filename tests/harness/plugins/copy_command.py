"""The command of `harness_test_plugin.COPY`: argv is SETTINGS OUT [--input=PORT=PATH ...].

It records its pid, inputs and some variables of its environment in `OUT/started`, allocates
`memory_mb`, sleeps `sleep_s`, then copies its inputs, fails or kills itself.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    settings = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    inputs = dict(arg.removeprefix("--input=").split("=", 1) for arg in sys.argv[3:])
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "SIMRUN_CORES", "SIMRUN_PROVENANCE")
    seen = {name: os.environ.get(name) for name in names}
    if settings.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / "started").write_text(json.dumps({"pid": os.getpid(), "inputs": inputs, **seen}))
    ballast = bytearray(settings.get("memory_mb", 0) << 20)  # zeroed, so its pages are touched
    time.sleep(settings.get("sleep_s", 0.0))
    del ballast
    mode = settings.get("mode", "copy")
    if mode == "fail":
        print("copy_command: failing as asked", file=sys.stderr)
        return 2
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    copied = out / "copied"
    copied.mkdir(parents=True, exist_ok=True)
    for port, path in inputs.items():
        for file in sorted(Path(path).rglob("*")):
            if file.is_file():
                target = copied / port / file.relative_to(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(file.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
