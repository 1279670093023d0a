"""The run's in-process backend (``farm.backend: local``): rollouts as asyncio tasks in the driver's process, over
one model. (The trainer API's, one ``RolloutWorker`` without Ray, is ``cluster.workers.in_process``.)"""

from __future__ import annotations

from cluster.backends.seam import Backend
from cluster.compose import Composer
from rollout.events import Observer
from rollout.protocols import HoldsConnections, Model
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

    async def close(self) -> None:
        """Close the model's client (its connection pool) and the run's gateway in this process."""
        if isinstance(self.model, HoldsConnections):
            await self.model.aclose()
        await self.composer.aclose()
