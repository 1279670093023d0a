"""RolloutFarm: the Python API for RL trainers (README, "Python API for trainers"):
``RolloutFarm.from_config(...)`` or ``from_objects(...)``; ``generate(tasks, n)`` → grouped results and trainer
samples; ``stream``; ``stream_groups`` (asynchronous RL: groups kept running while the caller trains); the controls
(``pause``/``resume``, ``set_policy_version``, ``reload_weights``); ``close``.

The farm keeps its workers (one Ray actor per node, or one in-process worker with ``backend="local"``) across
calls, so a training loop calls ``generate`` every step without restarting anything. Its asyncio machinery runs on
a private event-loop thread: the blocking methods work from plain code, the async ones from any event loop. A
rollout's failure never raises: it is a result with ``status == "infra_failed"``, retried up to ``max_attempts``
and then handled by the group policy.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Sequence, TextIO

from cluster.assembly import FarmAssembly
from cluster.assembly.backend_choice import BackendSettings
from cluster.backends.seam import Backend
from cluster.backends.sources import ConfigSource, ObjectSource
from cluster.config import ServeSection
from cluster.farm.batch import MemberBatch, from_run_config
from cluster.farm.controls import FarmControls
from cluster.farm.group_stream import GroupStreaming
from cluster.farm.loop_thread import LoopThread
from cluster.farm.tasks import check_sampling, dataset_tasks, prepare_tasks, stale_members
from rollout.errors import ConfigError
from rollout.records import RolloutResult, Task
from rollout.train.groups import Batch, GroupPolicy, apply_policy, group_results


class RolloutFarm(FarmControls, GroupStreaming):
    """Rollouts for a trainer, grouped n per task. Build with ``from_config`` or ``from_objects``."""

    def __init__(self, source: Any, *, backend: str = "ray", address: str | None = None,
                 num_cpus: int | None = None, resources: Any = None, concurrency: int = 64,
                 max_attempts: int = 3, seed: int = 0, deadline_per_attempt: float | None = None,
                 group_policy: GroupPolicy | dict | None = None, token_budget: int | None = None,
                 engines: Sequence[str] = (), name: str = "farm", out: TextIO = sys.stderr,
                 controls: Any = None, serve: ServeSection | None = None, model: dict | None = None,
                 played_here: ServeSection | None = None,
                 remote: bool = False, images: Any = None, config_file: str | Path | None = None):
        if backend not in ("ray", "local"):
            raise ConfigError(f"must be 'ray' or 'local', got {backend!r}", "farm.backend")
        self.source, self.backend_kind = source, backend
        self.address, self.num_cpus, self.resources = address, num_cpus, resources
        self.concurrency, self.max_attempts, self.seed = concurrency, max_attempts, seed
        self.deadline_per_attempt = deadline_per_attempt
        self.group_policy = (group_policy if isinstance(group_policy, GroupPolicy)
                             else GroupPolicy(**(group_policy or {})))
        self.token_budget, self.tokens_used = token_budget, 0
        self.engines, self.name, self.out = tuple(engines), name, out
        self.images = images
        self.config_file = config_file
        """The (first) config file: a ``dataset`` section's relative path is read beside it (``dataset()``)."""
        # the cluster session, the model it serves (a ``serve`` section deployed, or a scripted one played in
        # process: both when the farm starts) and the backend, in one place
        self._assembly = FarmAssembly(serve, model=model, address=address, num_cpus=num_cpus, backend=backend,
                                      played_here=played_here, remote=remote, out=out)
        self._controls = controls
        self._calls = itertools.count()
        self._backend: Backend | None = None
        self._loop_thread = LoopThread(f"rollout-farm-{name}")
        self._closed = False

    @classmethod
    def from_config(cls, config: str | Path | dict | list, overrides: Sequence[str] = (),
                    **options: Any) -> "RolloutFarm":
        """A farm from a run config (files merged in order, or a dict); ``dataset`` is not needed.
        ``farm``, ``run`` and ``serve`` sections apply; keyword options override them."""
        source, settings = from_run_config(config, overrides)
        return cls(source, **{**settings, **options})

    @classmethod
    def from_objects(cls, model: Any, agent: Any, env_factory: Callable, verifier_factory: Callable | None = None,
                     limits: Any = None, **options: Any) -> "RolloutFarm":
        """A farm from objects: ``env_factory(task, meta)`` returns a fresh environment per rollout,
        ``verifier_factory(task, env)`` its verifier (default: the environment's own ``verify``). With the ray
        backend they are pickled to the workers (module-level functions and classes pickle by reference)."""
        return cls(ObjectSource(model, agent, env_factory, verifier_factory, limits), **options)

    def profiles(self) -> dict[str | None, Any]:
        """The run config's profiles by name (None: the top-level one): each one's agent and component classes.
        Empty for a farm built from objects."""
        return dict(self.source.composer.profiles) if isinstance(self.source, ConfigSource) else {}

    def dataset(self) -> list[Task]:
        """The tasks of the config's ``dataset`` section, read as ``rollout run`` reads them: a file of rows or a
        directory of Harbor tasks (beside the config file), ``ids``/``pattern``/``slice`` applied, Harbor tasks'
        networks checked against the ``environment`` section. A ``ConfigError`` without such a section."""
        return dataset_tasks(self.source, self.config_file, self.out)

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        if self._closed:
            coro.close()
            raise RuntimeError("this RolloutFarm is closed")
        return self._loop_thread.run(coro, timeout)

    def start(self) -> "RolloutFarm":
        """Join or start Ray and start the workers (done by the first call that needs them)."""
        if self._backend is not None:
            return self
        settings = BackendSettings(
            run_id=self.name, concurrency=self.concurrency, resources=self.resources,
            deadline=self.deadline_per_attempt, engines=self.engines, name=f"rollout-worker:{self.name}",
            worker=True, images=self.images,
            image_of=self.source.composer.image_of if isinstance(self.source, ConfigSource) else None)
        # joined in the caller's (main) thread, as Ray wants; the rest on the farm's loop
        self._backend = self._run(self._assembly.open(self.source, settings))
        return self

    def generate(self, tasks: Iterable[Task | dict], n: int = 1, *, deadline: float | None = None,
                 seed: int | None = None, sampling: dict | None = None, max_staleness: float | None = None,
                 on_stale: str = "mask") -> Batch:
        """Run ``n`` samples of every task (``Task``s, or rows as a dataset file has them); return them grouped
        (``rollout.train.groups.Batch``; ``batch.samples()`` in the shape trainers consume).

        ``deadline``: seconds for the whole call; what has not finished is cancelled (containers removed) and
        returned as failed with ``deadline_exceeded``. ``seed``: sample i gets ``seed + i`` (default: the farm's
        seed + 1000 x the call number). ``sampling``: this call's ``temperature``, ``max_tokens``, ... over the
        model config's. ``max_staleness``: a member whose oldest turn is more than that many versions behind
        ``set_policy_version``'s is run again once (``on_stale="rerun"``) or masked (``"mask"``), and counted."""
        self.start()
        return self._run(self.agenerate(tasks, n, deadline=deadline, seed=seed, sampling=sampling,
                                        max_staleness=max_staleness, on_stale=on_stale))

    def submit(self, tasks: Iterable[Task | dict], n: int = 1, **options: Any) -> Any:
        """``generate`` without waiting, from any thread or event loop (a server's handlers; a trainer that sets
        the next policy version meanwhile): a ``concurrent.futures.Future`` of the batch. ``start`` first."""
        if self._backend is None or self._closed:
            raise RuntimeError("this RolloutFarm is not started (call start()) or is closed")
        return self._loop_thread.submit(self.agenerate(tasks, n, **options))

    async def agenerate(self, tasks: Iterable[Task | dict], n: int = 1, *, deadline: float | None = None,
                        seed: int | None = None, on_result: Callable[[RolloutResult], Any] | None = None,
                        sampling: dict | None = None, max_staleness: float | None = None,
                        on_stale: str = "mask", group_policy: GroupPolicy | None = None) -> Batch:
        """``generate`` for code already on the farm's loop (or wrap with ``stream`` from another loop).
        ``group_policy``: this call's, over the farm's (which no call changes: calls may run side by side)."""
        policy = group_policy or self.group_policy
        if on_stale not in ("mask", "rerun"):
            raise ValueError(f"on_stale: 'mask' or 'rerun', not {on_stale!r}")
        check_sampling(sampling)
        tasks = prepare_tasks(tasks, sampling)
        await self._assembly.post_tasks(tasks)  # a scripted model sees the tasks this call hands it
        call = next(self._calls)
        base_seed = self.seed + 1000 * call if seed is None else seed
        run_id = f"{self.name}-{call}"
        t0 = time.perf_counter()
        results, not_started = await self._members(tasks, list(range(n)), run_id, base_seed, deadline, on_result)
        by_key = {(r.task_id, r.sample_index): r for r in results}
        if policy.on_failure == "retry":
            for _ in range(policy.max_group_retries):
                failed = [r for r in by_key.values() if r.status != "completed"]
                if not failed:
                    break
                again = await self._retry(failed, tasks, run_id, base_seed, deadline, t0, on_result)
                by_key.update({(r.task_id, r.sample_index): r for r in again})
        stale = stale_members(by_key.values(), self.policy_version, max_staleness)
        reran = len(stale) if on_stale == "rerun" else 0
        if stale and on_stale == "rerun":
            again = await self._retry(stale, tasks, run_id, base_seed, deadline, t0, on_result)
            by_key.update({(r.task_id, r.sample_index): r for r in again})
            stale = stale_members(by_key.values(), self.policy_version, max_staleness)
        for r in stale:
            r.metadata["stale"] = True
        order = {t.task_id: i for i, t in enumerate(tasks)}
        groups = apply_policy(group_results(sorted(by_key.values(), key=lambda r: (order[r.task_id], r.sample_index))),
                              policy)
        batch = Batch(groups=[g for g in groups if not g.dropped], dropped=[g for g in groups if g.dropped],
                      not_started=not_started, wall_seconds=time.perf_counter() - t0,
                      tokens=sum(r.usage.total_tokens for r in by_key.values()), stale=len(stale), rerun=reran)
        return batch

    async def _retry(self, failed: list[RolloutResult], tasks: list[Task], run_id: str, base_seed: int,
                     deadline: float | None, t0: float, on_result: Any) -> list[RolloutResult]:
        """Run members again, together (same sample index, so the same seed), their attempt history kept."""
        if deadline is not None:
            deadline = max(0.0, deadline - (time.perf_counter() - t0))
        by_id = {t.task_id: t for t in tasks}
        runs = await asyncio.gather(*(self._members([by_id[r.task_id]], [r.sample_index], run_id, base_seed,
                                                    deadline, on_result, first_attempt=r.attempt + 1,
                                                    history=r.attempts) for r in failed))
        return [result for again, _ in runs for result in again]

    async def _members(self, tasks: list[Task], samples: list[int], run_id: str, base_seed: int,
                       deadline: float | None, on_result: Any, first_attempt: int = 1,
                       history: list | None = None) -> tuple[list[RolloutResult], list[tuple[str, int]]]:
        async def count(result: RolloutResult) -> None:
            self.tokens_used += result.usage.total_tokens
            if on_result is not None:
                maybe = on_result(result)
                if asyncio.iscoroutine(maybe):
                    await maybe

        budget = None if self.token_budget is None else (lambda: self.tokens_used >= self.token_budget)
        batch = MemberBatch(self._backend, concurrency=self.concurrency, max_attempts=self.max_attempts,
                            out=self.out, budget_spent=budget)
        return await batch.run(tasks, samples, run_id, base_seed, deadline, count, first_attempt, history)

    async def stream(self, tasks: Iterable[Task | dict], n: int = 1, *, deadline: float | None = None,
                     seed: int | None = None, **options: Any) -> AsyncIterator[RolloutResult]:
        """Yield each final result as it finishes (from any event loop); group retries are not applied; ``options``:
        ``sampling``, ``max_staleness``, ``on_stale`` as ``generate`` (a stale member is yielded before it is
        known stale: read ``batch.stale`` from ``generate`` when that matters)."""
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = object()
        await asyncio.to_thread(self.start)

        def push(item: Any) -> None:
            caller.call_soon_threadsafe(queue.put_nowait, item)

        async def produce() -> None:
            try:
                masked = self.group_policy.model_copy(update={"on_failure": "mask"})  # every member is yielded
                await self.agenerate(tasks, n, deadline=deadline, seed=seed, on_result=push, group_policy=masked,
                                     **options)
            finally:
                push(done)

        future = self._loop_thread.submit(produce())
        while True:
            item = await queue.get()
            if item is done:
                break
            yield item
        await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop the workers (their containers are removed) and the loop thread. Ray itself stays up."""
        if self._closed:
            return
        try:
            self._run(self._assembly.close())  # the workers and the model it serves, side by side
        finally:
            self._closed = True
            self._loop_thread.stop()

    def __enter__(self) -> "RolloutFarm":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
