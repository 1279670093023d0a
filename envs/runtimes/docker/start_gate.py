"""The start queue of one engine: container starts from this process go through it, at most ``start_limit`` in
flight and ``start_rate`` begun a second, in the order they asked; a start the engine fails under load (its own
5xx, a dropped connection, a timeout) is tried again after a backoff, and only then fails, as infrastructure.

A burst of 128 rollouts starting at once otherwise lands 128 creates on the daemon in one instant, and a daemon
on a small machine answers part of them with errors or timeouts. One worker process serves a node's rollouts,
so the queue is the node's (a node with several worker processes has one queue per process)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from envs.runtimes.docker.engines import explain, status
from rollout.errors import ContainerStartError

log = logging.getLogger(__name__)
T = TypeVar("T")

BACKOFF = 0.5
"""Seconds before the first retry of a start the engine failed; doubled for each further one, with jitter."""


@dataclass
class StartStats:
    """What the start queues of this process saw (``stats()``): for a bench, a test, a worker's report."""

    starts: int = 0
    """Starts that went through."""
    engine_errors: int = 0
    """Starts the engine failed under load (each was retried or, after the last retry, failed the attempt)."""
    gave_up: int = 0
    """Starts that still failed after ``start_retries``: their attempts failed as infrastructure."""
    in_flight_peak: int = 0
    waited: list[float] = field(default_factory=list)
    """Seconds each start waited in the queue before its turn (the latest 10,000)."""


_stats = StartStats()


def stats() -> StartStats:
    return _stats


def transient(exc: BaseException) -> bool:
    """Whether a failed start is worth another try here: the engine's own error (HTTP 5xx: it answered, and failed
    under load) or a connection it refused or dropped (a daemon restarting). Never a refusal that would be the same
    next time (no such image, a bad limit, a name in use), and never a start the engine did not answer within the
    client's timeout: a daemon that hangs is not helped by more requests, so that attempt fails at once as
    infrastructure and the node's health check takes over (``cluster.placement.health``)."""
    if isinstance(exc, ContainerStartError) and not exc.retryable:
        return False
    cause = exc.__cause__ or exc
    code = status(cause)
    if code is not None:
        return code >= 500
    if timed_out(cause):
        return False
    return isinstance(cause, OSError) or type(cause).__module__.split(".")[0] in ("requests", "urllib3")


def timed_out(exc: BaseException) -> bool:
    """The engine did not answer in time (the SDK's read timeout, under whichever of its libraries' names)."""
    return isinstance(exc, TimeoutError) or any("Timeout" in kind.__name__ for kind in type(exc).__mro__)


class StartGate:
    """At most ``limit`` starts in flight, at most ``rate`` begun a second (None: no pacing), first come first
    served."""

    def __init__(self, limit: int, rate: float | None):
        self.limit, self.rate = limit, rate
        self._slots = asyncio.Semaphore(limit)
        self._next = 0.0
        self._in_flight = 0

    async def run(self, start: Callable[[], Awaitable[T]], *, retries: int, engine: str,
                  before_retry: Callable[[], Awaitable[None]] | None = None) -> T:
        """``start()`` in its turn; an engine error under load waits ``BACKOFF`` (doubling, with jitter) and takes
        its turn again, up to ``retries`` times; ``before_retry`` clears what a half-done start may have left."""
        tries = 0
        while True:
            try:
                return await self._in_turn(start)
            except ContainerStartError as exc:
                if not transient(exc):
                    raise
                _stats.engine_errors += 1
                if tries == retries:
                    _stats.gave_up += 1
                    raise ContainerStartError(f"{exc} (the {engine} engine failed this start {retries + 1} times; "
                                              f"runtime.start_retries={retries})") from exc
                tries += 1
                log.warning("%s engine failed a container start (%s); trying again (%d of %d)", engine,
                            explain(exc.__cause__ or exc), tries, retries)
            if before_retry is not None:
                await before_retry()
            await asyncio.sleep(BACKOFF * 2 ** (tries - 1) * random.uniform(0.75, 1.25))

    async def _in_turn(self, start: Callable[[], Awaitable[T]]) -> T:
        asked = time.monotonic()
        async with self._slots:
            if self.rate:
                now = time.monotonic()
                turn = max(now, self._next)
                self._next = turn + 1.0 / self.rate
                if turn > now:
                    await asyncio.sleep(turn - now)
            _stats.waited.append(time.monotonic() - asked)
            del _stats.waited[:-10_000]
            self._in_flight += 1
            _stats.in_flight_peak = max(_stats.in_flight_peak, self._in_flight)
            try:
                found = await start()
            finally:
                self._in_flight -= 1
            _stats.starts += 1
            return found


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, StartGate]] = weakref.WeakKeyDictionary()


def gate_for(engine: str, base_url: str | None, limit: int, rate: float | None) -> StartGate:
    """The start queue of one engine (and limits) on the running event loop."""
    per_loop = _gates.setdefault(asyncio.get_running_loop(), {})
    key = (engine, base_url, limit, rate)
    if key not in per_loop:
        per_loop[key] = StartGate(limit, rate)
    return per_loop[key]
