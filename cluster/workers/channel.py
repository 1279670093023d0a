"""The driver's end of one worker actor: rollouts go out in batches and results come back in batches.

One Ray actor call per rollout costs the driver about a millisecond to submit and the worker as much to
receive, and its result is a pickled pydantic record; at thousands of rollouts in flight that, not the
rollouts, is what a node spends its core on. So the channel sends every rollout that became ready in the
same turn of the event loop as one ``submit`` call, and keeps one ``collect`` call outstanding that returns
every result finished since the last one (as JSON, ``cluster.workers.wire``). Under load the batches grow by
themselves; an idle farm sends batches of one and loses nothing in latency.

A worker that dies fails every rollout the channel has in flight on it with ``WorkerGone`` (once), and
``cancel(seq)`` stops one rollout on the worker (its runtime closes what it started); its future then
resolves to None.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ray.exceptions import RayActorError

from cluster.workers.mailbox import LeaseLost
from rollout.records import RequestMeta, Task


class WorkerGone(Exception):
    """The worker actor holding this rollout died or could not be reached; ``cause`` is Ray's error."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {first_line(cause)}")
        self.cause = cause


class Channel:
    def __init__(self, actor: Any, on_lost: Callable[[BaseException], None], collect_wait: float = 30.0,
                 slots: int | None = None, lease: str | None = None):
        self.actor, self.on_lost, self.collect_wait = actor, on_lost, collect_wait
        self.lease = lease
        """The run's lease of a kept worker (``cluster.workers.kept``), sent with every call; None: its own worker."""
        self.slots = slots
        """Rollouts the worker runs at once; what the driver sends beyond them waits there for a slot."""
        self.pending: dict[int, asyncio.Future] = {}
        self.gone: BaseException | None = None
        self._outgoing: list[tuple[int, Task, RequestMeta]] = []
        self._flush: asyncio.Handle | None = None
        self._collector: asyncio.Task | None = None
        self.calls = 0
        """``submit`` calls made (rollouts sent / calls is the mean batch)."""

    def send(self, seq: int, task: Task, meta: RequestMeta) -> asyncio.Future:
        """Queue a rollout for the next batch; the future resolves to its encoded result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self.gone is not None:
            future.set_exception(WorkerGone(self.gone))
            return future
        self.pending[seq] = future
        self._outgoing.append((seq, task, meta))
        if self._flush is None:
            self._flush = loop.call_soon(self._send_batch)
        if self._collector is None:
            self._collector = loop.create_task(self._collect())
        return future

    def resize(self, slots: int) -> None:
        """The worker runs at most ``slots`` from now on (its node's adaptive limit changed): told at once, not with
        the next batch; a higher count starts what waits there."""
        self.slots = slots
        if self.gone is None:
            as_future(self.actor.submit.remote([], slots, self.lease)).add_done_callback(retrieve)

    def cancel(self, seq: int) -> None:
        """Stop one rollout on the worker; its future resolves to None once it has unwound."""
        if self.gone is None:  # a gone worker's error is moot
            as_future(self.actor.cancel.remote([seq], self.lease)).add_done_callback(retrieve)

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._collector is not None:
            self._collector.cancel()
            await asyncio.gather(self._collector, return_exceptions=True)
            self._collector = None
        self._fail_all(RuntimeError("the farm closed"))

    def _send_batch(self) -> None:
        self._flush = None
        batch, self._outgoing = self._outgoing, []
        if not batch or self.gone is not None:
            return
        self.calls += 1
        try:
            ref = self.actor.submit.remote(batch, self.slots, self.lease)
        except Exception as exc:  # noqa: BLE001 - arguments that do not serialise: those rollouts fail
            for seq, _, _ in batch:
                _fail(self.pending.pop(seq, None), exc)
            return
        future = as_future(ref)
        future.add_done_callback(lambda f: self._submitted(f, batch))

    def _submitted(self, future: asyncio.Future, batch: list[tuple[int, Task, RequestMeta]]) -> None:
        if future.cancelled() or future.exception() is None:
            return
        exc = future.exception()
        if isinstance(exc, (RayActorError, LeaseLost)):
            self.lost(exc)
        else:  # the worker could not take this batch (e.g. a task that does not unpickle there)
            for seq, _, _ in batch:
                _fail(self.pending.pop(seq, None), exc)

    async def _collect(self) -> None:
        while self.gone is None:
            try:
                items = await as_future(self.actor.collect.remote(self.collect_wait, self.lease))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an actor that cannot answer is as good as gone
                self.lost(exc)
                return
            for seq, payload in items:
                future = self.pending.pop(seq, None)
                if future is not None and not future.done():
                    future.set_result(payload)

    def lost(self, exc: BaseException) -> None:
        """The worker is gone for this driver: every rollout in flight on it fails, and ``on_lost`` is told."""
        if self.gone is not None:
            return
        self.gone = exc
        self._fail_all(exc)
        self.on_lost(exc)

    def _fail_all(self, exc: BaseException) -> None:
        pending, self.pending = self.pending, {}
        for future in pending.values():
            _fail(future, exc)


def _fail(future: asyncio.Future | None, exc: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(WorkerGone(exc))


def as_future(ref: Any) -> asyncio.Future:
    """An actor call's result as an asyncio future of the running loop (never ``ray.get`` in async code)."""
    return asyncio.wrap_future(ref.future())


def retrieve(future: asyncio.Future) -> None:
    """A done-callback that marks a future's error as seen: an abandoned call's error is expected."""
    if not future.cancelled():
        future.exception()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""
