"""api: `POST /runs` latency, the lag of SSE subscribers of a live run, the service's memory.

- `POST /runs` of a small workflow (one `command` task running `true`), `posts` times on a
  fresh local service, each run left to end before the next submission (so each is timed on an
  idle service); baseline: `GET /me` on the same connection just before or after it (the floor
  of an authenticated request: routing, auth, a JSON answer).
- SSE: a run (a `command` task holding `sse_hold_s`, then squares of `sse_units` units of
  `sse_sleep_s`) followed by `sse_subscribers` concurrent `GET /runs/{run}/events`. A separate
  process watches the run's log with inotify and notes when each line is appended; each
  subscriber notes when each message arrives (raw sockets, timestamps taken as the bytes come,
  parsed afterwards). The lag of an event at a subscriber is arrival - append, over the events
  appended once every subscriber is connected. Baseline: the same run with one subscriber.
- `GET /me` under load: `load_runs` runs of `load_units` zero-work squares submitted at once
  (from as many threads), while a thread asks `GET /me` every 20 ms on a connection of its own
  until every run ended; baseline: the same sampling on the idle service just before. (A test
  of the suite, `tests/reliability/test_load.py`, runs the same load for its correctness
  only.)
- peak RSS: VmHWM of the service process at the end of this benchmark; baseline: its RSS right
  after it started.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import ctypes
import multiprocessing
import os
import re
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from benchmarks.common import Context, Row, median, percentile
from benchmarks.service import BenchService, start_service, stop_service
from benchmarks.stream_tokens import stream_token, write_stream_tokens

POST_GOAL_MS = 30.0
SSE_GOAL_MS = 100.0
LOADED_ME_GOAL_MS = 200.0
ME_EVERY_S = 0.02
IDLE_SAMPLES = 50
RSS_GOAL_MIB = 250.0
IN_MODIFY = 0x2
SEQ = re.compile(rb'"seq":(\d+)')
MESSAGE_ID = re.compile(rb"(?:^|\n)id: (\d+)\r?\n")
STREAM_TIMEOUT_S = 120.0


def small_workflow() -> dict:
    """One `command` task running `true`."""
    settings = {"image": "none", "args": ["true"], "cores": 1, "memory_gb": 0.5}
    return {"name": "small", "tasks": [{"id": "hello", "type": "command", "settings": settings}]}


def followed_workflow(hold_s: float, units: int, sleep_s: float) -> dict:
    """A run that holds (so subscribers connect) and then appends events for a few seconds."""
    hold = {"image": "none", "args": ["sleep", f"{hold_s:g}"], "cores": 1, "memory_gb": 0.5}
    return {
        "name": "followed",
        "tasks": [
            {"id": "hold", "type": "command", "settings": hold},
            {
                "id": "squares",
                "type": "demo.squares",
                "settings": {"n": units, "sleep_s": sleep_s},
                "inputs": {"after": "hold.out"},
            },
        ],
    }


# -- POST /runs ----------------------------------------------------------------------------


def post_latencies(ctx: Context, service: BenchService) -> tuple[list[float], list[float]]:
    """Milliseconds of each `POST /runs` and of each `GET /me` beside it."""
    posts, floors = [], []
    workflow = small_workflow()
    for number in range(ctx.size.posts):
        me_first = number % 2 == 0
        if me_first:
            floors.append(_timed_ms(lambda: service.client.get("/me").raise_for_status()))
        started = time.perf_counter()
        record = service.submit(workflow)
        posts.append((time.perf_counter() - started) * 1000)
        if not me_first:
            floors.append(_timed_ms(lambda: service.client.get("/me").raise_for_status()))
        item = service.wait(record["id"])
        if item["state"] != "succeeded":
            raise RuntimeError(f"run {record['id']} of POST {number} is {item['state']}")
    return posts, floors


def _timed_ms(action) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


# -- GET /me under load --------------------------------------------------------------------


class MeSampler:
    """`GET /me` asked in a thread on a connection of its own every `ME_EVERY_S` until
    stopped: the milliseconds of each answer."""

    def __init__(self, service: BenchService) -> None:
        self.client = httpx.Client(
            base_url=service.url,
            headers={"Authorization": f"Bearer {service.token}"},
            timeout=120.0,
            trust_env=False,
        )
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, name="sample-me")

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.samples.append(_timed_ms(lambda: self.client.get("/me").raise_for_status()))
            self.stop.wait(ME_EVERY_S)

    def __enter__(self) -> MeSampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=120)
        self.client.close()


def loaded_me(ctx: Context, service: BenchService) -> tuple[list[float], list[float]]:
    """The milliseconds of `GET /me` on the idle service, then while `load_runs` runs of
    `load_units` zero-work units submitted at once run to their end."""
    size = ctx.size
    workflow = {
        "name": "load",
        "tasks": [
            {
                "id": "squares",
                "type": "demo.squares",
                "settings": {"n": size.load_units, "sleep_s": 0},
            }
        ],
    }
    with MeSampler(service) as idle:
        while len(idle.samples) < IDLE_SAMPLES and idle.thread.is_alive():
            idle.stop.wait(ME_EVERY_S)
    barrier = threading.Barrier(size.load_runs)

    def submit(_: int) -> str:
        barrier.wait(timeout=120)
        return str(service.submit(workflow)["id"])

    with MeSampler(service) as loaded:
        with ThreadPoolExecutor(max_workers=size.load_runs) as pool:
            runs = list(pool.map(submit, range(size.load_runs)))
        for run_id in runs:
            item = service.wait(run_id, timeout=600)
            if item["state"] != "succeeded":
                raise RuntimeError(f"run {run_id} of the load is {item['state']}")
    if not idle.samples or not loaded.samples:
        raise RuntimeError("GET /me was not sampled")
    return idle.samples, loaded.samples


# -- the append times of a log -------------------------------------------------------------


def watch_log(path: str, stop: Any, results: Any) -> None:
    """In a process of its own: the monotonic time each seq of a log was first seen in it.

    inotify wakes it on every write to the file (a poll every 1 ms where inotify is missing).
    """
    with contextlib.suppress(OSError):
        os.nice(-5)  # an instrument: woken at once when the service writes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    watching = fd >= 0 and libc.inotify_add_watch(fd, path.encode(), IN_MODIFY) >= 0
    seen: dict[int, float] = {}
    pending = b""
    with open(path, "rb") as log:
        while True:
            stopping = stop.is_set()
            if watching:
                ready, _, _ = select.select([fd], [], [], 0.05)
                if ready:
                    os.read(fd, 65536)
            else:
                time.sleep(0.001)
            now = time.monotonic()
            pending += log.read()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                match = SEQ.search(line)
                if match:
                    seen.setdefault(int(match[1]), now)
            if stopping:
                break
    if fd >= 0:
        os.close(fd)
    results.put(seen)


# -- SSE subscribers -----------------------------------------------------------------------


class Subscriber(asyncio.Protocol):
    """One SSE subscriber on a raw socket: keeps every chunk with the time it came."""

    def __init__(self, request: bytes, closed: asyncio.Future[None]) -> None:
        self.request = request
        self.closed = closed
        self.chunks: list[tuple[float, bytes]] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the request."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        """Keep the bytes with their time; parse later."""
        self.chunks.append((time.monotonic(), data))

    def connection_lost(self, exc: Exception | None) -> None:
        """The stream ended (the server closes it after the run's last event)."""
        if not self.closed.done():
            self.closed.set_result(None)

    def arrivals(self) -> dict[int, float]:
        """The time each message (by its `id`, the seq) arrived complete."""
        data = b"".join(chunk for _, chunk in self.chunks)
        ends, total = [], 0
        for _, chunk in self.chunks:
            total += len(chunk)
            ends.append(total)
        found: dict[int, float] = {}
        for match in MESSAGE_ID.finditer(data):
            end = data.find(b"\r\n\r\n", match.end())
            end = len(data) if end < 0 else end + 4
            chunk = bisect.bisect_left(ends, end)
            found.setdefault(int(match[1]), self.chunks[min(chunk, len(ends) - 1)][0])
        return found


async def follow(
    port: int, tokens: list[str], run_id: str, count: int
) -> tuple[list[Subscriber], float]:
    """Connect `count` subscribers (spread over `tokens`, `stream_token`), wait for the end of
    their streams; them and the time all of them had their first bytes."""
    loop = asyncio.get_running_loop()
    subscribers = []
    for n in range(count):
        request = (
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {stream_token(tokens, n)}\r\n"
            "Accept: text/event-stream\r\nConnection: close\r\n\r\n"
        ).encode()
        closed: asyncio.Future[None] = loop.create_future()
        subscriber = Subscriber(request, closed)
        await loop.create_connection(lambda s=subscriber: s, "127.0.0.1", port)
        subscribers.append(subscriber)
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    while not all(s.chunks for s in subscribers):
        if time.monotonic() > deadline:
            raise RuntimeError("subscribers got no answer")
        await asyncio.sleep(0.005)
    ready = max(s.chunks[0][0] for s in subscribers)
    await asyncio.wait_for(
        asyncio.gather(*(s.closed for s in subscribers)), deadline - time.monotonic()
    )
    return subscribers, ready


def sse_trial(ctx: Context, service: BenchService, tokens: list[str], count: int) -> list[float]:
    """The lags (ms) of every event at every one of `count` subscribers of one live run."""
    size = ctx.size
    record = service.submit(followed_workflow(size.sse_hold_s, size.sse_units, size.sse_sleep_s))
    run_id = record["id"]
    context = multiprocessing.get_context("fork")
    stop, results = context.Event(), context.Queue()
    watcher = context.Process(
        target=watch_log, args=(str(service.events_path(run_id)), stop, results)
    )
    watcher.start()
    try:
        subscribers, ready = asyncio.run(follow(int(service.info["port"]), tokens, run_id, count))
    finally:
        stop.set()
    seen: dict[int, float] = results.get(timeout=60)
    watcher.join(30)
    item = service.wait(run_id)
    if item["state"] != "succeeded":
        raise RuntimeError(f"the followed run {run_id} is {item['state']}")
    lags = []
    measured = {seq: when for seq, when in seen.items() if when > ready}
    for subscriber in subscribers:
        arrivals = subscriber.arrivals()
        missing = set(seen) - set(arrivals)
        if missing:
            raise RuntimeError(f"a subscriber missed events {sorted(missing)[:5]}")
        lags += [(arrivals[seq] - when) * 1000 for seq, when in measured.items()]
    if not lags:
        raise RuntimeError("no event was appended after every subscriber connected")
    return lags


def run(ctx: Context) -> list[Row]:
    """Measure submissions, SSE lag and memory on one fresh service; the rows of the table."""
    size = ctx.size
    _, tokens = write_stream_tokens(ctx.scratch / "project", size.sse_subscribers)
    service = start_service(ctx.scratch / "project")
    try:
        idle_rss = service.rss_bytes() / 1024**2
        if size.warm_up:
            service.wait(service.submit(small_workflow())["id"])
        posts, floors = post_latencies(ctx, service)
        ctx.log(f"POST /runs median {median(posts):.1f} ms, GET /me median {median(floors):.1f} ms")
        many: list[list[float]] = []
        one: list[list[float]] = []
        for rep in range(size.reps):
            order = [(one, 1), (many, size.sse_subscribers)]
            if rep % 2:
                order.reverse()
            for target, count in order:
                target.append(sse_trial(ctx, service, tokens, count))
        idle_me: list[list[float]] = []
        loaded: list[list[float]] = []
        for _ in range(size.reps):
            before, during = loaded_me(ctx, service)
            idle_me.append(before)
            loaded.append(during)
        peak_rss = service.peak_rss_bytes() / 1024**2
    finally:
        stop_service(service)
    p50 = median([percentile(lags, 0.5) for lags in many])
    p99 = median([percentile(lags, 0.99) for lags in many])
    p50_one = median([percentile(lags, 0.5) for lags in one])
    p99_one = median([percentile(lags, 0.99) for lags in one])
    samples = sum(len(lags) for lags in many)
    ctx.log(f"SSE lag with {size.sse_subscribers}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    me_p99 = median([percentile(samples, 0.99) for samples in loaded])
    me_idle_p99 = median([percentile(samples, 0.99) for samples in idle_me])
    ctx.log(f"GET /me during {size.load_runs} runs: p99 {me_p99:.1f} ms")
    return [
        Row(
            key="api.post.median",
            benchmark=f"api: POST /runs, small workflow, median of {len(posts)}",
            simrun=median(posts),
            baseline=median(floors),
            unit="ms",
            goal=f"<= {POST_GOAL_MS:g} ms",
            met=median(posts) <= POST_GOAL_MS,
            note=(
                "one `command` task running `true`, each run ended before the next POST; "
                "httpx keep-alive client; baseline: GET /me on the same connection"
            ),
        ),
        Row(
            key="api.post.p99",
            benchmark=f"api: POST /runs, small workflow, p99 of {len(posts)}",
            simrun=percentile(posts, 0.99),
            baseline=percentile(floors, 0.99),
            unit="ms",
        ),
        Row(
            key="api.sse.p50",
            benchmark=f"api: SSE lag append -> arrival, {size.sse_subscribers} subscribers, p50",
            simrun=p50,
            baseline=p50_one,
            unit="ms",
            note=(
                f"{samples:,} (event, subscriber) samples over {size.reps} runs, median of the "
                "runs' percentiles; baseline: the same run with one subscriber"
            ),
        ),
        Row(
            key="api.sse.p99",
            benchmark=f"api: SSE lag append -> arrival, {size.sse_subscribers} subscribers, p99",
            simrun=p99,
            baseline=p99_one,
            unit="ms",
            goal=f"<= {SSE_GOAL_MS:g} ms",
            met=p99 <= SSE_GOAL_MS,
        ),
        Row(
            key="api.me.loaded.p99",
            benchmark=(
                f"api: GET /me during {size.load_runs} runs of {size.load_units} "
                "zero-work units submitted at once, p99"
            ),
            simrun=me_p99,
            baseline=me_idle_p99,
            unit="ms",
            goal=f"<= {LOADED_ME_GOAL_MS:g} ms",
            met=me_p99 <= LOADED_ME_GOAL_MS,
            note=(
                f"{sum(len(samples) for samples in loaded):,} samples over {size.reps} loads, "
                "one every 20 ms on a connection of its own, median of the loads' p99; "
                "baseline: the same sampling on the idle service just before each load"
            ),
        ),
        Row(
            key="api.rss",
            benchmark="api: service peak RSS (VmHWM) over this benchmark",
            simrun=peak_rss,
            baseline=idle_rss,
            unit="MiB",
            goal=f"<= {RSS_GOAL_MIB:g} MiB",
            met=peak_rss <= RSS_GOAL_MIB,
            note="baseline: the RSS of the service right after it started",
        ),
    ]
