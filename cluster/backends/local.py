"""In-process backends: the run's (``farm.backend: local``, rollouts as asyncio tasks in the driver's process) and
the trainer API's, which drives one ``RolloutWorker`` (pause gate, policy version) without Ray."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.backends.seam import Backend
from cluster.compose import Composer
from rollout.events import Observer
from rollout.protocols import Model
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.runner import failure_result, run_rollout


class LocalBackend(Backend):
    def __init__(self, composer: Composer, model: Model, model_url: str | None = None):
        self.composer = composer
        self.model, self.model_url = model, model_url

    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        try:
            parts = self.composer.parts(task, meta)
        except Exception as exc:  # noqa: BLE001 - one rollout's broken parts never stop the others
            result = failure_result(task, meta, exc)
        else:
            result = await run_rollout(task, parts.agent, self.model, parts.env, verifier=parts.verifier, meta=meta,
                                       limits=parts.limits, observers=observers)
        result.model_url = result.model_url or self.model_url
        return result


class InProcessBackend(Backend):
    """``RolloutFarm(backend="local")``: one ``RolloutWorker`` in this process, with the farm's broadcast."""

    def __init__(self, source: Any):
        from cluster.workers.worker import RolloutWorker

        self.worker = RolloutWorker(source, node_id="")

    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        return await self.worker.execute(task, meta)

    async def broadcast(self, method: str, *args: Any) -> list[Any]:
        out = getattr(self.worker, method)(*args)
        return [await out if asyncio.iscoroutine(out) else out]

    async def live(self) -> list[dict[str, Any]]:
        return self.worker.live()

    async def close(self) -> None:
        await self.worker.shutdown()
