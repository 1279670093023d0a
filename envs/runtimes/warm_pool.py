"""WarmPool: runtimes started ahead, so a rollout's first command does not wait for a container start.

A pooled runtime is handed to exactly one rollout (never reused); taking one starts a replacement in
the background. When none is ready, the caller gets a cold start rather than waiting for the pool.
Pools are per process and per runtime config (``pool_for``); ``close_all`` empties them at exit.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Callable, Hashable

from rollout.protocols import Runtime

log = logging.getLogger(__name__)


class WarmPool:
    def __init__(self, factory: Callable[[], Runtime], size: int, warmup: str | None = "true"):
        if size < 1:
            raise ValueError("a warm pool needs size >= 1")
        self.factory = factory
        self.size = size
        self.warmup = warmup
        """A command run once in each pooled runtime, so the rollout's first command finds the exec path warm."""
        self._ready: collections.deque[Runtime] = collections.deque()
        self._starting: set[asyncio.Task] = set()
        self._closed = False
        self.hits = 0
        self.misses = 0

    @property
    def ready(self) -> int:
        return len(self._ready)

    def fill(self) -> None:
        """Start runtimes in the background until ``size`` are ready or starting."""
        while not self._closed and len(self._ready) + len(self._starting) < self.size:
            task = asyncio.get_running_loop().create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        runtime = self.factory()
        try:
            await runtime.start()
            if self.warmup:
                await runtime.exec(self.warmup, timeout=30)
        except Exception:  # noqa: BLE001 - a failed warm start is logged; the rollout will start cold
            log.warning("warm pool: a runtime failed to start", exc_info=True)
            await _quiet_close(runtime)
            return
        if self._closed:
            await _quiet_close(runtime)
        else:
            self._ready.append(runtime)

    async def acquire(self) -> Runtime:
        """A started runtime for one rollout: from the pool when one is ready, else started now."""
        if self._closed:
            raise RuntimeError("warm pool is closed")
        if self._ready:
            runtime = self._ready.popleft()
            self.hits += 1
        else:
            runtime = self.factory()
            self.misses += 1
            await runtime.start()
        self.fill()
        return runtime

    async def close(self) -> None:
        """Stop refilling and close every runtime not handed out."""
        self._closed = True
        # Not cancelled: a start half done in a worker thread would leave its container behind. Each
        # finishing start sees the pool closed and closes its runtime.
        await asyncio.gather(*self._starting, return_exceptions=True)
        while self._ready:
            await _quiet_close(self._ready.popleft())


async def _quiet_close(runtime: Runtime) -> None:
    try:
        await runtime.close()
    except Exception:  # noqa: BLE001 - closing is best effort; containers are also reaped by label
        log.warning("warm pool: closing a runtime failed", exc_info=True)


_pools: dict[tuple[Hashable, int], WarmPool] = {}


def pool_for(key: Hashable, factory: Callable[[], Runtime], size: int) -> WarmPool:
    """The pool of this process and event loop for ``key`` (e.g. engine, image and limits), filling."""
    loop_key = (key, id(asyncio.get_running_loop()))
    pool = _pools.get(loop_key)
    if pool is None or pool._closed:
        pool = _pools[loop_key] = WarmPool(factory, size)
        pool.fill()
    return pool


async def close_all() -> dict[str, Any]:
    """Close the pools of the running loop; returns their hit/miss counts."""
    loop_id = id(asyncio.get_running_loop())
    stats: dict[str, Any] = {}
    for (key, lid), pool in list(_pools.items()):
        if lid == loop_id:
            await pool.close()
            stats[str(key)] = {"hits": pool.hits, "misses": pool.misses}
            del _pools[(key, lid)]
    return stats
