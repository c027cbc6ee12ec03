"""A stand-in of the local service for the tests of `ensure_local`, speaking its protocol.

Run in a project directory: it appends `<pid> <SIMRUN_BACKGROUND>` to `.simrun/starts.txt`,
exits 3 when `.simrun/service.json` names another live process (like `ServiceRunning`), else
listens on 127.0.0.1, writes `service.json`, answers `GET /local/instance` without a token and
`GET /me` with the token `TOKEN`, logs every request to `.simrun/requests.txt`, and on SIGTERM
removes its `service.json` and exits 0. `FAKE_MODE=exit` prints a message and exits 4 at once;
`FAKE_MODE=silent` never answers. Its `service.json` records the environment of this process,
with the types `FAKE_TYPES` if set; `FAKE_FOREGROUND=1` says it runs in the foreground.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from simrun_cli.local import environment

TOKEN = "fake-token"
SIMRUN = Path(".simrun")


def other_service_runs() -> bool:
    try:
        info = json.loads((SIMRUN / "service.json").read_text())
        os.kill(info["pid"], 0)
    except (OSError, ValueError, KeyError):
        return False
    return info["pid"] != os.getpid()


def main() -> None:
    with open(SIMRUN / "starts.txt", "a") as starts:
        starts.write(f"{os.getpid()} {os.environ.get('SIMRUN_BACKGROUND', '')}\n")
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "exit":
        print("boom: the fake service cannot start", flush=True)
        sys.exit(4)
    if mode == "silent":
        time.sleep(120)
        return
    if other_service_runs():
        print("the local service runs already", flush=True)
        sys.exit(3)
    instance = secrets.token_hex(8)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with open(SIMRUN / "requests.txt", "a") as log:
                log.write(f"{self.path} {self.headers.get('Authorization', '-')}\n")
            if self.path == "/local/instance":
                self.answer(200, {"instance": instance})
            elif self.path == "/me" and self.headers.get("Authorization") == f"Bearer {TOKEN}":
                self.answer(200, {"name": "me", "kind": "person", "owner": "me"})
            else:
                self.answer(401, {"status_code": 401, "detail": "no"})

        def answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    info = {
        "instance": instance,
        "pid": os.getpid(),
        "port": port,
        "token": TOKEN,
        "url": f"http://127.0.0.1:{port}",
        "background": os.environ.get("SIMRUN_BACKGROUND") == "1"
        and os.environ.get("FAKE_FOREGROUND") != "1",
        **environment(),
    }
    if os.environ.get("FAKE_TYPES"):
        info["types"] = os.environ["FAKE_TYPES"]
    partial = SIMRUN / "service.json.tmp"
    partial.write_text(json.dumps(info))
    partial.replace(SIMRUN / "service.json")

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        (SIMRUN / "service.json").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
