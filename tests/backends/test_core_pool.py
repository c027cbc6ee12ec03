"""The local pool of cores and GPUs: first come, each GPU to one request at a time."""

from __future__ import annotations

import asyncio

from simrun_api.backends.cores import CorePool, Grant


def test_gpus_are_granted_alone_and_a_request_waits_for_free_ones() -> None:
    async def scenario() -> None:
        pool = CorePool(8, ["3", "5"])
        first = await pool.acquire(1, 1, gpus=1)
        second = await pool.acquire(1, 1, gpus=1)
        assert {first.gpus, second.gpus} == {("3",), ("5",)}
        assert pool.gpus_used == 2
        third = asyncio.ensure_future(pool.acquire(2, 1, gpus=1))
        plain = asyncio.ensure_future(pool.acquire(3, 1))
        await asyncio.sleep(0)
        assert not third.done() and not plain.done(), "first come: the plain one waits too"
        pool.release(first)
        granted = await third
        assert granted.gpus == first.gpus
        assert await plain == Grant(1, ())
        pool.release(second)
        pool.release(granted)
        assert await pool.acquire(4, 1, gpus=5) == Grant(1, ("3", "5")), "at most all"

    asyncio.run(scenario())


def test_a_cancelled_wait_gives_nothing_away() -> None:
    async def scenario() -> None:
        pool = CorePool(2, ["0"])
        held = await pool.acquire(1, 1, gpus=1)
        waiting = asyncio.ensure_future(pool.acquire(2, 1, gpus=1))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        pool.release(held)
        assert pool.gpus_used == 0 and pool.free == 2

    asyncio.run(scenario())


def test_a_gpu_named_twice_is_granted_to_one_request_at_a_time() -> None:
    async def scenario() -> None:
        pool = CorePool(8, ["3", "3"])
        held = await pool.acquire(1, 1, gpus=1)
        assert held.gpus == ("3",)
        waiting = asyncio.ensure_future(pool.acquire(2, 1, gpus=1))
        await asyncio.sleep(0)
        assert not waiting.done(), "GPU 3 is held: the second request waits"
        pool.release(held)
        assert (await waiting).gpus == ("3",)

    asyncio.run(scenario())
