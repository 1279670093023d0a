"""Waits a cancel cannot slip past: a bounded await, a sleep that a stop flag ends, cancel-then-wait with a bound.

On Python 3.11 ``asyncio.wait_for`` returns its inner call's result when a cancel lands in the turn that call
finished (CPython gh-86296): the cancel is lost, and a loop around the call runs on after its ``cancel()``. So a
bounded await here is ``asyncio.timeout`` (3.11+; 3.10 has only ``wait_for``), a background loop stops by a flag it
looks at every round (a lost cancel then costs one round, not the process), and the wait for cancelled tasks
has a bound.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Iterable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_timeout = getattr(asyncio, "timeout", None)
"""``asyncio.timeout`` (Python 3.11+): a timer on the waiting task, not a task around the call."""


async def within(call: Awaitable[T], seconds: float | None) -> T:
    """``await call``, cut after ``seconds`` (None: no bound) with ``asyncio.TimeoutError``. A cancel of the waiting
    task always raises, even in the turn ``call`` finished (on 3.10 ``wait_for``'s race remains)."""
    if seconds is None:
        return await call
    if _timeout is None:  # Python 3.10
        return await asyncio.wait_for(call, seconds)
    async with _timeout(seconds):
        return await call


async def sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile; True when it is set (the loop should end)."""
    if not stop.is_set():
        try:
            await within(stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass
    return stop.is_set()


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], grace: float, what: str = "task") -> set[Any]:
    """Cancel ``tasks`` and wait at most ``grace`` seconds for them to end; return (and log) those still running.

    Their errors are retrieved (a cancelled task's error is moot). Tasks that outlive the bound are left to the
    event loop's own end: the caller goes on (writes its results, releases its lock) instead of hanging."""
    tasks = set(tasks)
    for task in tasks:
        task.cancel()
    if not tasks:
        return set()
    done, pending = await asyncio.wait(tasks, timeout=grace)
    for task in done:
        if not task.cancelled():
            task.exception()
    if pending:
        log.warning("%d %s(s) still running %gs after their cancel; going on without them", len(pending), what,
                    grace)
    return pending
