"""The local backend: rollouts run as asyncio tasks in the driver's own process."""

from __future__ import annotations

from cluster.compose import Composer
from rollout.events import Observer
from rollout.protocols import Model
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.runner import failure_result, run_rollout


class LocalBackend:
    def __init__(self, composer: Composer, model: Model):
        self.composer = composer
        self.model = model

    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        try:
            parts = self.composer.parts(task, meta)
        except Exception as exc:  # noqa: BLE001 - one rollout's broken parts never stop the others
            return failure_result(task, meta, exc)
        return await run_rollout(
            task, parts.agent, self.model, parts.env,
            verifier=parts.verifier, meta=meta, limits=parts.limits, observers=observers,
        )
