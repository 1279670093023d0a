"""A worker's mailbox: the Ray backend's protocol of many rollouts per actor call (``cluster.workers.channel`` is
the driver's end).

``submit`` takes a batch of rollouts and ``collect`` returns every result finished since the last call (a long
poll). A worker runs at most ``slots`` rollouts at once (its node's slots as the driver counts them); the driver
may send more, ahead of the slots that free, and those wait here first come first started. So when a rollout
ends, the next one starts in the same turn of the worker's event loop — as in a plain asyncio loop under a
semaphore — instead of after a round trip to the driver, which under load waits behind every other message
of both event loops (bench_farm (a): tens of ms per hop at 256 in flight).
"""

from __future__ import annotations

import asyncio
import collections
import time

from cluster.workers.wire import encode_result
from rollout.records import RequestMeta, Task
from rollout.runner import failure_result
from rollout.waits import within

Encoded = tuple[int, bytes]
"""A result as ``cluster.workers.wire.encode_result`` makes it."""


class LeaseLost(Exception):
    """A call for a run that no longer holds this (kept) worker: its lease expired and another run took it."""


class Mailbox:
    """Mixed into the worker, which provides ``execute(task, meta) -> RolloutResult``."""

    def _open_mailbox(self, holder: str | None = None) -> None:
        self.holder = holder
        """The run whose calls this mailbox takes (a kept worker's lease, ``cluster.workers.kept``); None: any."""
        self._running: dict[int, asyncio.Task] = {}
        self._waiting: collections.deque[tuple[int, Task, RequestMeta, float]] = collections.deque()
        self.slots: int | None = None
        """Rollouts run at once; more wait in ``_waiting``. None: no limit (a driver that sends only what fits)."""
        self._outbox: list[tuple[int, Encoded | None]] = []
        self._ready: asyncio.Event | None = None

    @property
    def waiting(self) -> int:
        """Rollouts received that wait for a slot."""
        return len(self._waiting)

    def _check_lease(self, lease: str | None) -> None:
        if lease is not None and lease != self.holder:
            raise LeaseLost(f"this worker's lease of {lease} ended; it runs for another run now")

    async def submit(self, batch: list[tuple[int, Task, RequestMeta]], slots: int | None = None,
                     lease: str | None = None) -> int:
        """Take ``(seq, task, meta)`` rollouts: each starts at once while fewer than ``slots`` run (no limit when
        None), else waits here, first come first started, for one to finish. So a driver may send the next
        rollouts ahead of the slots that free, and a slot is refilled without a round trip to it. Each result
        goes to the outbox that ``collect`` empties. ``lease``: the run sending them (a kept worker takes only its
        holder's calls)."""
        self._check_lease(lease)
        if slots is not None:
            self.slots = slots
        now = time.perf_counter()
        self._waiting.extend((seq, task, meta, now) for seq, task, meta in batch)
        self._start_waiting()
        return len(batch)

    def _start_waiting(self) -> None:
        while self._waiting and (self.slots is None or len(self._running) < self.slots):
            seq, task, meta, received = self._waiting.popleft()
            queued = time.perf_counter() - received
            self._running[seq] = asyncio.create_task(self._deliver(seq, task, meta, queued))

    async def _deliver(self, seq: int, task: Task, meta: RequestMeta, queued: float) -> None:
        payload: Encoded | None
        try:
            result = await self.execute(task, meta)
            result.timings["queued"] = queued  # waited here for a slot
            payload = encode_result(result)
        except asyncio.CancelledError:  # the driver cancelled it (a deadline): it unwound; None says so
            payload = None
        except Exception as exc:  # noqa: BLE001 - reported as this rollout's failure, never lost
            payload = encode_result(failure_result(task, meta, exc))
        self._running.pop(seq, None)
        self._post(seq, payload)
        self._start_waiting()

    def _post(self, seq: int, payload: Encoded | None) -> None:
        self._outbox.append((seq, payload))
        if self._ready is not None:
            self._ready.set()

    async def collect(self, wait: float = 30.0, lease: str | None = None) -> list[tuple[int, Encoded | None]]:
        """Every ``(seq, encoded result)`` finished since the last call; waits up to ``wait`` s for one."""
        self._check_lease(lease)
        if self._ready is None:
            self._ready = asyncio.Event()
        if not self._outbox:
            self._ready.clear()
            try:
                await within(self._ready.wait(), wait)  # cancelled, it must not take the outbox to nobody
            except asyncio.TimeoutError:
                pass
        self._check_lease(lease)  # the lease may have passed to another run while this call waited
        out, self._outbox = self._outbox, []
        return out

    async def _cancel_all(self) -> None:
        """Every rollout stopped: the waiting ones dropped, the running ones cancelled and unwound."""
        self._waiting.clear()
        running = list(self._running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def cancel(self, seqs: list[int], lease: str | None = None) -> None:
        """Cancel rollouts: a running one's runtime closes what it started, a waiting one never starts; ``collect``
        reports None for each."""
        self._check_lease(lease)
        waiting = set(seqs) & {item[0] for item in self._waiting}
        if waiting:
            self._waiting = collections.deque(item for item in self._waiting if item[0] not in waiting)
            for seq in waiting:
                self._post(seq, None)
        for seq in seqs:
            task = self._running.get(seq)
            if task is not None:
                task.cancel()
