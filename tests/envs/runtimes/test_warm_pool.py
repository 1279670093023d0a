"""The warm pool: runtimes started ahead, each handed to one rollout only, refilled, emptied at close."""

import asyncio

import pytest

from envs.runtimes.null import NullRuntime, NullRuntimeConfig
from envs.runtimes.warm_pool import WarmPool, close_all, pool_for


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


@pytest.mark.docker
def test_docker_runtime_takes_started_containers_from_its_warm_pool(base_image):
    import subprocess

    from envs.runtimes.docker.runtime import DockerRuntime

    async def main():
        config = {"image": base_image, "warm_pool": 2}
        first = DockerRuntime(config, run_id="pool-test", rollout_id="a")
        await first.start()  # the pool is empty yet: a cold start, and the pool begins to fill
        for _ in range(100):
            await asyncio.sleep(0.1)
            if sum(p.ready for p in __import__("envs.runtimes.warm_pool").runtimes.warm_pool._pools.values()) >= 2:
                break
        second = DockerRuntime(config, run_id="pool-test", rollout_id="b")
        await second.start()
        assert "-pool-" in second.name and second.container_id != first.container_id
        assert (await second.exec("echo warm")).output == "warm\n"
        await first.close()
        await second.close()
        return await close_all()

    stats = asyncio.run(main())
    (hits_misses,) = stats.values()
    assert hits_misses == {"hits": 1, "misses": 1}
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=rollout-farm.run=pool-test"],
                          capture_output=True, text=True).stdout.split()
    assert left == []  # the pool's idle containers went with it
