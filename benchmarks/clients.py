"""clients: what many clients of one service hold, and whether the others still get answers.

One service on the FakeBackend (`fake_service.py`, the real server, app, actors and logs) with
one live run (its pod's units written at `clients_rate` per second), in three phases, each
holding its clients `clients_hold_s` seconds:

- `clients_subscribers` SSE subscribers of the live run that read everything (`GET
  /runs/{run}/events`), spread over identities of at most `max_streams_per_identity` each;
- `clients_silent` subscribers that never read a byte of their streams;
- `clients_slow` connections that never finish their headers (one byte a second).

Meanwhile a process of its own asks `GET /me` every 10 ms: its p99 is the figure (goal <= 100
ms), its baseline the p99 on the idle service just before. The service's RSS is sampled every
0.2 s: its growth over the phase (goal <= 100 MiB) and, after the clients left, what it kept
(goal <= 20 MiB). All traffic goes to 127.0.0.1; every phase has its bound in clients and time.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.common import Context, Row, percentile
from benchmarks.many_runs import FakeService, _wait_for, workflow
from benchmarks.stream_tokens import stream_token, write_stream_tokens

ME_GOAL_MS = 100.0
GROWTH_GOAL_MIB = 100.0
KEPT_GOAL_MIB = 20.0
PROBE_EVERY_S = 0.01
SETTLE_S = 10.0
"""How long after the clients left the service gets to give their memory back."""
CONNECT_AT_ONCE = 100


def probe_me(url: str, token: str, seconds: float, out: Any) -> None:
    """In a process of its own: GET /me every `PROBE_EVERY_S` for `seconds`; the latencies
    (ms, a timeout of 10 s counted as 10,000) into `out`."""
    latencies = []
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0, trust_env=False
    ) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                ok = client.get("/me").status_code == 200
            except httpx.HTTPError:
                ok = False
            elapsed = (time.perf_counter() - started) * 1000
            latencies.append(elapsed if ok else 10_000.0)
            time.sleep(max(0.0, PROBE_EVERY_S - elapsed / 1000))
    out.put(latencies)


class Client(asyncio.Protocol):
    """A connection that sends its request and then reads (or not) what comes."""

    def __init__(self, request: bytes, read: bool) -> None:
        self.request = request
        self.read = read
        self.received = 0
        self.status = b""
        self.closed = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)
        if not self.read:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if not self.status:
            self.status = data[9:12]
        self.received += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True


async def _connect(port: int, requests: list[bytes], read: bool) -> list[Client]:
    loop = asyncio.get_running_loop()
    clients = [Client(request, read) for request in requests]
    for start in range(0, len(clients), CONNECT_AT_ONCE):
        await asyncio.gather(
            *(
                loop.create_connection(lambda c=client: c, "127.0.0.1", port)
                for client in clients[start : start + CONNECT_AT_ONCE]
            )
        )
    return clients


def _abort(clients: list[Client]) -> None:
    """Drop every connection at once (no close handshake)."""
    for client in clients:
        if client.transport is not None:
            client.transport.abort()


async def _trickle(clients: list[Client], rest: bytes, seconds: float) -> None:
    """Send one byte of `rest` a second on each connection (never all of it)."""
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end and sent < len(rest) - 1:
        await asyncio.sleep(1.0)
        for client in clients:
            if client.transport is not None and not client.transport.is_closing():
                client.transport.write(rest[sent : sent + 1])
        sent += 1


class Phase:
    """One phase: its clients, GET /me meanwhile and the service's RSS."""

    def __init__(self, service: FakeService, token: str, hold_s: float) -> None:
        self.service = service
        self.token = token
        self.hold_s = hold_s

    def run(self, clients: Callable[[], Any]) -> dict[str, Any]:
        """Start the probe, run `clients()` (a coroutine function holding them), sample the
        RSS until they left and it settled; the figures."""
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        probe_s = self.hold_s * 1.25 + 0.5  # the clients connect meanwhile
        start_rss = self.service.rss_kib() / 1024
        probe = context.Process(
            target=probe_me, args=(self.service.info["url"], self.token, probe_s, out)
        )
        probe.start()
        peak = [start_rss]
        sampling = True

        async def sample() -> None:
            while sampling:
                peak.append(self.service.rss_kib() / 1024)
                await asyncio.sleep(0.2)

        async def main() -> Any:
            nonlocal sampling
            sampler = asyncio.create_task(sample())
            try:
                return await clients()
            finally:
                sampling = False
                await sampler

        result = asyncio.run(main())
        latencies = out.get(timeout=probe_s + 60)
        probe.join(30)
        kept = self._settled(start_rss)
        return {
            "me_p99": percentile(latencies, 0.99),
            "me_samples": len(latencies),
            "growth": max(peak) - start_rss,
            "kept": kept - start_rss,
            "start": start_rss,
            **(result or {}),
        }

    def _settled(self, start_rss: float) -> float:
        """The RSS once back near the start, or after `SETTLE_S`."""
        end = time.monotonic() + SETTLE_S
        rss = self.service.rss_kib() / 1024
        while time.monotonic() < end and rss - start_rss > KEPT_GOAL_MIB / 2:
            time.sleep(0.5)
            rss = self.service.rss_kib() / 1024
        return rss


def _stream_requests(port: int, run_id: str, tokens: list[str], count: int) -> list[bytes]:
    return [
        (
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {stream_token(tokens, n)}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
        for n in range(count)
    ]


def run(ctx: Context) -> list[Row]:
    """The three phases on one service; the rows of the table."""
    size = ctx.size
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = size.clients_subscribers + size.clients_slow + 512
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    root = ctx.scratch / "service"
    most = max(size.clients_subscribers, size.clients_silent)
    mine, others = write_stream_tokens(root, most)
    hold = size.clients_hold_s
    units = int(size.clients_rate * (3 * hold + 120))  # live through every phase
    service = FakeService(root, rate=size.clients_rate)
    try:
        port = int(service.info["port"])
        run_id = service.client.post("/runs", json={"workflow": workflow(units)}).json()["id"]

        def running() -> bool:
            return service.client.get(f"/runs/{run_id}").json()["state"] == "running"

        _wait_for(running, "the run running", 120)
        (root / "go").touch()
        quiet = min(3.0, hold)
        idle = Phase(service, mine, quiet).run(lambda: asyncio.sleep(quiet))
        ctx.log(f"idle: GET /me p99 {idle['me_p99']:.1f} ms, RSS {idle['start']:.0f} MiB")

        async def subscribers(read: bool, count: int) -> dict[str, Any]:
            requests = _stream_requests(port, run_id, others, count)
            clients = await _connect(port, requests, read)
            await asyncio.sleep(hold)
            answered = sum(c.status == b"200" for c in clients) if read else None
            refused = sum(c.status == b"429" for c in clients) if read else None
            cut = sum(c.closed for c in clients)
            received = sum(c.received for c in clients)
            _abort(clients)
            return {"answered": answered, "refused": refused, "cut": cut, "bytes": received}

        reading = Phase(service, mine, hold).run(
            lambda: subscribers(True, size.clients_subscribers)
        )
        ctx.log(f"{size.clients_subscribers} subscribers: {reading}")
        silent = Phase(service, mine, hold).run(lambda: subscribers(False, size.clients_silent))
        ctx.log(f"{size.clients_silent} silent subscribers: {silent}")

        async def slow() -> dict[str, Any]:
            request = f"GET /me HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer "
            head = request.encode()
            clients = await _connect(port, [head[:16]] * size.clients_slow, True)
            await _trickle(clients, head[16:] + mine.encode(), hold)
            cut = sum(c.closed for c in clients)
            _abort(clients)
            return {"cut": cut}

        slow_headers = Phase(service, mine, hold).run(slow)
        ctx.log(f"{size.clients_slow} slow-header connections: {slow_headers}")
        load = os.getloadavg()
    finally:
        service.stop()
    return _rows(size, idle, reading, silent, slow_headers, load)


def _me_p99_row(key: str, during: str, p99: float, idle_p99: float, note: str) -> Row:
    """GET /me's p99 during a phase against the idle service's, and its goal."""
    return Row(
        key=f"clients.{key}.me_p99",
        benchmark=f"clients: GET /me p99 during {during}",
        simrun=p99,
        baseline=idle_p99,
        unit="ms",
        goal=f"<= {ME_GOAL_MS:g} ms",
        met=p99 <= ME_GOAL_MS,
        note=note,
    )


def _rss_row(key: str, benchmark: str, mib: float, before: float, goal: float, note: str) -> Row:
    """A change of the service's RSS against its RSS before the phase, and its goal."""
    return Row(
        key=key,
        benchmark=benchmark,
        simrun=mib,
        baseline=before,
        unit="MiB",
        goal=f"<= {goal:g} MiB",
        met=mib <= goal,
        note=note,
    )


def _rows(
    size: Any,
    idle: dict[str, Any],
    reading: dict[str, Any],
    silent: dict[str, Any],
    slow: dict[str, Any],
    load: tuple[float, float, float],
) -> list[Row]:
    loaded = f"load average at the end {load[0]:.1f} (the machine is shared with others)"
    rows = []
    for key, name, figures in (
        ("sse", f"{size.clients_subscribers:,} SSE subscribers of one live run", reading),
        ("silent", f"{size.clients_silent:,} SSE subscribers that never read", silent),
    ):
        rows += [
            _me_p99_row(
                key,
                name,
                figures["me_p99"],
                idle["me_p99"],
                note=(
                    f"{figures['me_samples']} GET /me, one every {PROBE_EVERY_S * 1000:g} ms "
                    f"from a process of its own over {size.clients_hold_s:g} s; "
                    f"answered {figures['answered']}, 429 {figures['refused']}, cut "
                    f"{figures['cut']}; baseline: the idle service; {loaded}"
                ),
            ),
            _rss_row(
                f"clients.{key}.rss_growth",
                f"clients: service RSS growth during {name}",
                figures["growth"],
                figures["start"],
                GROWTH_GOAL_MIB,
                note="peak of samples every 0.2 s minus the RSS before; baseline: that RSS",
            ),
            _rss_row(
                f"clients.{key}.rss_kept",
                f"clients: service RSS kept after {name} left",
                figures["kept"],
                figures["start"],
                KEPT_GOAL_MIB,
                note=f"the RSS up to {SETTLE_S:g} s after they left minus the RSS before",
            ),
        ]
    rows.append(
        _me_p99_row(
            "slow",
            f"{size.clients_slow:,} connections that never finish their headers",
            slow["me_p99"],
            idle["me_p99"],
            note=(
                f"one byte a second on each; {slow['cut']} cut by the header deadline within "
                f"{size.clients_hold_s:g} s; {loaded}"
            ),
        )
    )
    return rows
