"""The warm pool: runtimes started ahead, each handed to one rollout only, refilled, emptied at close."""

import asyncio

import pytest

from envs.null_runtime import NullRuntime, NullRuntimeConfig
from envs.warm_pool import WarmPool, close_all, pool_for


class CountingRuntime(NullRuntime):
    started = 0
    closed = 0

    async def start(self):
        await asyncio.sleep(0.05)  # a container start takes time
        CountingRuntime.started += 1
        await super().start()

    async def close(self):
        CountingRuntime.closed += 1
        await super().close()


def factory():
    return CountingRuntime(NullRuntimeConfig())


def test_runtimes_are_started_ahead_never_reused_and_refilled():
    async def main():
        pool = WarmPool(factory, size=3)
        pool.fill()
        await asyncio.sleep(0.2)
        assert pool.ready == 3
        taken = [await pool.acquire() for _ in range(3)]
        assert len({id(r) for r in taken}) == 3 and pool.hits == 3
        await asyncio.sleep(0.2)
        assert pool.ready == 3  # refilled in the background
        assert all(id(r) not in {id(t) for t in taken} for r in pool._ready)
        for r in taken:
            assert (await r.exec("echo hi")).returncode == 0
        await pool.close()
        return taken

    CountingRuntime.started = CountingRuntime.closed = 0
    asyncio.run(main())
    assert CountingRuntime.started == 6
    assert CountingRuntime.closed == 3  # the idle ones; the three handed out belong to their rollouts


def test_an_empty_pool_starts_cold_instead_of_waiting():
    async def main():
        pool = WarmPool(factory, size=1)
        first = await pool.acquire()  # nothing ready yet: a cold start
        assert pool.misses == 1 and pool.hits == 0
        await first.close()
        await pool.close()

    asyncio.run(main())


def test_pools_are_per_key_and_close_all_empties_them():
    async def main():
        a = pool_for(("img", "a"), factory, 2)
        b = pool_for(("img", "b"), factory, 1)
        assert pool_for(("img", "a"), factory, 2) is a and a is not b
        await asyncio.sleep(0.2)
        stats = await close_all()
        assert set(stats) == {str(("img", "a")), str(("img", "b"))}
        assert a.ready == 0 and b.ready == 0
        with pytest.raises(RuntimeError):
            await a.acquire()

    asyncio.run(main())
