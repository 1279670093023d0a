"""Groups kept running while a trainer trains (asynchronous RL): ``RolloutFarm.stream_groups``.

    with farm.stream_groups(tasks, n=8, batch_groups=16, max_staleness=1) as stream:
        for step, batch in zip(range(10), stream):      # the first 16 groups to finish
            train(batch.samples())
            farm.reload_weights(checkpoint, version=step + 1)  # the running rollouts go on under the new weights

The farm starts groups from ``tasks`` (any iterable, endless or not) in the background and keeps going while the
caller trains on the last batch. How far it may run ahead is bounded the way AReaL bounds it: with u weight
updates since the stream began (``set_policy_version`` / ``reload_weights`` with a new version), groups start
while fewer than ``(u + max_staleness + 1) * batch_groups`` have started, so a group started under the u-th
version is handed out by the (u + max_staleness)-th batch, which the caller trains on under that version
(``max_staleness=0``: each batch is sampled under the weights it trains, as a synchronous loop does; ``None``: no
bound, the farm keeps ``2 * batch_groups`` beyond those handed out).
A group that still finishes later is caught when the batch is taken: a member whose oldest turn is more than
``max_staleness`` versions behind the farm's ``policy_version`` is masked (``on_stale="mask"``) or run once more
(``"rerun"``), and counted. Every turn records the version it was sampled under, so a rollout that spans a weight
update carries both (``Batch.versions``: completion tokens per version).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Iterable

from cluster.farm.tasks import check_sampling, stale_members
from rollout.data.dataset import task_from_row
from rollout.errors import ConfigError
from rollout.records import RolloutResult, Task
from rollout.train.groups import Batch, Group


class GroupStream:
    """Batches of finished groups, in the order they finish; see the module docstring. ``next_batch`` (plain code),
    ``anext_batch`` (any event loop), iteration (either); ``close`` cancels the groups still running."""

    def __init__(self, farm: Any, tasks: Iterable[Task | dict], n: int = 1, *, batch_groups: int,
                 max_staleness: int | None = 1, on_stale: str = "mask", sampling: dict | None = None):
        if n < 1 or batch_groups < 1:
            raise ValueError(f"n and batch_groups: at least 1 (got n={n}, batch_groups={batch_groups})")
        if on_stale not in ("mask", "rerun"):
            raise ValueError(f"on_stale: 'mask' or 'rerun', not {on_stale!r}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness: 0 or more, or None for no bound (got {max_staleness})")
        check_sampling(sampling)
        self.farm, self.n, self.batch_groups = farm, n, batch_groups
        self.max_staleness, self.on_stale, self.sampling = max_staleness, on_stale, sampling
        self._tasks = iter(tasks)
        self._exhausted = False
        self._running: set[asyncio.Task] = set()
        self._done: deque[tuple[Task, Batch]] = deque()
        self._error: BaseException | None = None
        self._changed: asyncio.Event | None = None
        self.started = self.taken = self.updates = 0
        """Groups started, groups handed out in batches (dropped ones included), weight updates seen."""
        self.idle_seconds = 0.0
        """Time no group ran while more could have (the bound held them back: the farm waited on the trainer)."""
        self._idle_since: float | None = None
        self.on_close: Any = lambda stream: None

    # ---- from the caller's side -------------------------------------------------------------------------------

    def start(self) -> "GroupStream":
        """Start the groups the bound allows now (``stream_groups`` does), not at the first ``next_batch``."""
        self.farm._run(self._next_ready())
        return self

    def next_batch(self, timeout: float | None = None) -> Batch:
        """The next ``batch_groups`` groups to finish (fewer at the end of ``tasks``); ``StopIteration`` when none
        is left."""
        try:
            return self.farm._run(self._next(), timeout)
        except StopAsyncIteration:
            raise StopIteration from None

    async def anext_batch(self) -> Batch:
        return await asyncio.wrap_future(self.farm._loop_thread.submit(self._next()))

    def __iter__(self) -> "GroupStream":
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def __aiter__(self) -> "GroupStream":
        return self

    async def __anext__(self) -> Batch:
        return await self.anext_batch()

    def close(self) -> None:
        """Cancel the groups still running (their containers are removed); the farm stays up."""
        self.on_close(self)
        if not self.farm._closed:
            self.farm._run(self._cancel())

    def __enter__(self) -> "GroupStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- on the farm's loop -----------------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """How many groups may have started by now (the bound in the module docstring)."""
        if self.max_staleness is None:
            return self.taken + 2 * self.batch_groups
        return (self.updates + int(self.max_staleness) + 1) * self.batch_groups

    async def _version_changed(self) -> None:
        self.updates += 1
        self._pump()

    def _pump(self) -> None:
        """Start groups while the bound allows and tasks are left."""
        while not self._exhausted and self.started < self.limit:
            try:
                item = next(self._tasks)
            except StopIteration:
                self._exhausted = True
                break
            try:
                task = item if isinstance(item, Task) else task_from_row(dict(item), f"tasks[{self.started}]")
            except (ConfigError, TypeError, ValueError) as exc:  # a malformed row: raised at the next batch
                self._error = self._error or exc
                self._exhausted = True
                break
            self.started += 1
            if self._idle_since is not None:
                self.idle_seconds += time.monotonic() - self._idle_since
                self._idle_since = None
            job = asyncio.get_running_loop().create_task(self._group(task))
            self._running.add(job)
            job.add_done_callback(self._finished)

    async def _group(self, task: Task) -> None:
        try:
            batch = await self.farm.agenerate([task], self.n, sampling=self.sampling)
        except Exception as exc:  # noqa: BLE001 - a bad task is the caller's error: raised at the next batch
            self._error = self._error or exc
        else:
            self._done.append((task, batch))

    def _finished(self, job: asyncio.Task) -> None:
        self._running.discard(job)
        if not self._running and not self._exhausted:
            self._idle_since = time.monotonic()
        if self._changed is not None:
            self._changed.set()

    async def _next_ready(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()  # on the farm's loop
        self._pump()

    async def _next(self) -> Batch:
        t0 = time.perf_counter()
        await self._next_ready()
        while len(self._done) < self.batch_groups and self._error is None:
            if not self._running:
                if self._exhausted:
                    break  # the last, short batch
                raise RuntimeError(
                    f"no group can start: {self.started} started, and max_staleness={self.max_staleness} allows "
                    f"{self.limit} until a new policy version (set_policy_version or reload_weights): with "
                    f"max_staleness=k, at most k + 1 batches are taken per version")
            self._changed.clear()
            await self._changed.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if not self._done:
            raise StopAsyncIteration
        taken = [self._done.popleft() for _ in range(min(self.batch_groups, len(self._done)))]
        self.taken += len(taken)
        self._pump()  # room for the next groups while the caller trains on these
        kept = [(task, g) for task, b in taken for g in b.groups]
        stale, (reran, tokens) = await self._check_staleness(kept)
        return Batch(groups=[g for _, g in kept], dropped=[g for _, b in taken for g in b.dropped],
                     wall_seconds=time.perf_counter() - t0, tokens=sum(b.tokens for _, b in taken) + tokens,
                     stale=stale, rerun=reran)

    async def _check_staleness(self, kept: list[tuple[Task, Group]]) -> tuple[int, tuple[int, int]]:
        """Mask (or run once more, then mask) the members now more than ``max_staleness`` versions behind."""
        current = self.farm.policy_version
        stale = stale_members([r for _, g in kept for r in g.results], current, self.max_staleness)
        reran = tokens = 0
        if stale and self.on_stale == "rerun":
            reran = len(stale)
            ids = {id(r) for r in stale}
            again = await asyncio.gather(*(self._again(task, g, r) for task, g in kept for r in list(g.results)
                                           if id(r) in ids))
            tokens = sum(r.usage.total_tokens for r in again)
            stale = stale_members([r for _, g in kept for r in g.results], current, self.max_staleness)
        for r in stale:
            r.metadata["stale"] = True
        return len(stale), (reran, tokens)

    async def _again(self, task: Task, group: Group, member: RolloutResult) -> RolloutResult:
        """``member`` run again with its own seed, in its place in ``group``."""
        batch = await self.farm.agenerate([task], 1, seed=member.seed, sampling=self.sampling)
        result = batch.results[0].model_copy(update={"sample_index": member.sample_index})
        group.results[next(i for i, r in enumerate(group.results) if r is member)] = result
        return result

    async def _cancel(self) -> None:
        self._exhausted = True
        for job in list(self._running):
            job.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


class GroupStreaming:
    """Mixed into ``RolloutFarm``."""

    def stream_groups(self, tasks: Iterable[Task | dict], n: int = 1, *, batch_groups: int,
                      max_staleness: int | None = 1, on_stale: str = "mask",
                      sampling: dict | None = None) -> GroupStream:
        """Groups of ``n`` samples of ``tasks`` kept running in the background, handed out ``batch_groups`` at a
        time as they finish, generation bounded by ``max_staleness`` (``GroupStream``)."""
        self.start()  # type: ignore[attr-defined]
        stream = GroupStream(self, tasks, n, batch_groups=batch_groups, max_staleness=max_staleness,
                             on_stale=on_stale, sampling=sampling)
        streams = self.__dict__.setdefault("_streams", set())
        streams.add(stream)
        stream.on_close = streams.discard
        return stream.start()

    def _versions_changed(self) -> None:
        """A new policy version: every open stream may start the groups it held back."""
        for stream in list(self.__dict__.get("_streams", ())):
            self._run(stream._version_changed())  # type: ignore[attr-defined]
