"""The rollout worker: one process per farm node that runs many rollouts concurrently with the same loop
as the local backend (``run_rollout``), on behalf of a driver.

The class is plain Python (``cluster.workers.ray_backend`` makes it a Ray actor), so it is also testable without
a cluster. What to build per rollout comes from a *source*: ``ConfigSource`` (a run config's ``Composer``,
validated once by the driver) or ``ObjectSource`` (objects a trainer handed to ``RolloutFarm``, shipped by pickling).
Every model call of the worker goes through one gate, so ``pause()`` stops new model calls during a weight
update and ``set_policy_version()`` stamps the version on every turn that starts after it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

from cluster.backends.live_tracker import LiveTracker
from cluster.backends.sources import RolloutSource
from cluster.workers.mailbox import Mailbox
from cluster.workers.metrics import FarmMetrics
from cluster.workers.reaping import reap_dead_owners
from envs.runtimes.docker.containers import NODE_ENV, remove_tracked
from envs.runtimes.warm_pool import close_all
from rollout import events
from rollout.gc_tuning import tune_gc
from rollout.protocols import EndsSessions, HoldsConnections, Model, ModelResponse
from rollout.records import Message, RequestMeta, RolloutResult, Task
from rollout.runner import failure_result, run_rollout
from rollout.store.run_dir import RunStore, partial_trajectory_writer


class GatedModel:
    """The worker's model behind its pause gate; stamps the policy version current when a call starts. It passes on
    what the model it wraps offers beyond ``complete`` (``EndsSessions``, ``HoldsConnections``)."""

    def __init__(self, inner: Model, worker: RolloutWorker):
        self.inner, self.worker = inner, worker

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *,
                       meta: RequestMeta | None = None, **sampling: Any) -> ModelResponse:
        await self.worker.gate.wait()
        version = self.worker.policy_version
        if version is not None and meta is not None and meta.policy_version != version:
            meta = meta.model_copy(update={"policy_version": version})  # the request carries it
        response = await self.inner.complete(messages, tools, meta=meta, **sampling)
        if response.policy_version is None and version is not None:
            response = response.model_copy(update={"policy_version": version})
        return response

    async def end_session(self, meta: RequestMeta) -> None:
        """The rollout ended: the inner model lets go of what it kept for it (its token stream, its replica)."""
        if isinstance(self.inner, EndsSessions):
            await self.inner.end_session(meta)

    async def aclose(self) -> None:
        if isinstance(self.inner, HoldsConnections):
            await self.inner.aclose()


class RolloutWorker(Mailbox):
    """Runs rollouts for a driver. ``node_id`` labels the containers it creates (``rollout-farm.node``)."""

    def __init__(self, source: RolloutSource, *, node_id: str = "", run_dir: str | None = None,
                 metrics_run: str | None = None):
        if node_id:
            os.environ[NODE_ENV] = node_id
        tune_gc()
        self.node_id = node_id
        self.ident = f"{socket.gethostname()}:{os.getpid()}"
        self._bind(source, run_dir=run_dir, metrics_run=metrics_run)

    def _bind(self, source: RolloutSource, *, run_dir: str | None, metrics_run: str | None,
              holder: str | None = None) -> None:
        """Everything of one run's: its source, directory, metrics tag, live rows, counts, model, pause gate, policy
        version and a fresh mailbox (``holder``: the run whose calls it takes). A kept worker binds again for each
        run that leases it (``cluster.workers.kept``), so nothing of the run before is left."""
        self.source = source
        self.run_dir = run_dir
        self.policy_version: str | None = None
        self.tracker = LiveTracker(self.node_id, self.ident)
        self.finished = 0
        self._model: GatedModel | None = None
        self._gate: asyncio.Event | None = None
        self._open_mailbox(holder)
        self.metrics: FarmMetrics | None = None
        if metrics_run is not None:  # inside Ray: the farm's metrics (cluster.workers.metrics), tagged with the run
            self.metrics = FarmMetrics(metrics_run)

    @property
    def gate(self) -> asyncio.Event:
        if self._gate is None:  # created on the actor's event loop, not in __init__
            self._gate = asyncio.Event()
            self._gate.set()
        return self._gate

    def info(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "worker": self.ident, "pid": os.getpid(), "finished": self.finished,
                "in_flight": len(self.tracker), "waiting": self.waiting, "policy_version": self.policy_version,
                "paused": self._gate is not None and not self._gate.is_set()}

    async def execute(self, task: Task, meta: RequestMeta) -> RolloutResult:
        if self._model is None:
            self._model = GatedModel(self.source.build_model(), self)
        try:
            parts = self.source.parts(task, meta)
        except Exception as exc:  # noqa: BLE001 - one rollout's broken parts never stop the others
            result = failure_result(task, meta, exc)
        else:
            key = self.tracker.start(meta)
            try:
                result = await run_rollout(task, parts.agent, self._model, parts.env, verifier=parts.verifier,
                                           meta=meta, limits=parts.limits, observers=self._observers(meta, key))
            finally:
                self.tracker.finish(key)
                self.source.release(task)
        self.finished += 1
        result.node_id, result.worker = self.node_id or None, self.ident
        result.model_url = result.model_url or self.source.model_url
        return result

    def _observers(self, meta: RequestMeta, key: tuple[str, int]) -> list[events.Observer]:
        observers = [self.tracker.observer(key)]
        if self.run_dir is not None and Path(self.run_dir).is_dir():  # a file system shared with the driver
            observers.append(partial_trajectory_writer(RunStore(self.run_dir), meta))
        if self.metrics is not None:
            observers.append(self.metrics.observer)
        return observers

    def live(self) -> list[dict[str, Any]]:
        """The in-flight rollouts of this worker: task, sample, attempt, step, last command, times, node."""
        return self.tracker.rows()

    def set_base_url(self, base_url: str) -> None:
        """The model's URL, known once the run's Serve app answers (this worker started meanwhile)."""
        self.source.base_url = base_url
        self._model = None  # built at the next rollout, against the URL

    def set_policy_version(self, version: str | int | None) -> None:
        self.policy_version = None if version is None else str(version)

    def pause(self) -> None:
        self.gate.clear()

    def resume(self) -> None:
        self.gate.set()

    def reap_dead_owners(self, run_id: str, engines: tuple[str, ...]) -> int:
        """Remove containers of ``run_id`` on this host whose creating process is gone (a dead worker's)."""
        return reap_dead_owners(run_id, engines, out=None)

    async def shutdown(self) -> None:
        """Close the model's connections, the source's gateway, the warm pools, and every container this process
        still tracks."""
        await self._cancel_all()
        if self._model is not None:
            await self._model.aclose()
            self._model = None
        if self.metrics is not None:
            await self.metrics.aclose()
        await self.source.aclose()
        await close_all()
        await asyncio.to_thread(remove_tracked)
