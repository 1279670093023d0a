"""``InProcessBackend``: the trainer API's backend without Ray (``RolloutFarm(backend="local")``), one
``RolloutWorker`` in this process (pause gate, policy version), with the farm's broadcast."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.backends.seam import Backend, WorkerSource
from cluster.workers.worker import RolloutWorker
from rollout.events import Observer
from rollout.records import RequestMeta, RolloutResult, Task


class InProcessBackend(Backend):
    def __init__(self, source: WorkerSource):
        self.worker = RolloutWorker(source, node_id="")

    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        return await self.worker.execute(task, meta)

    async def broadcast(self, method: str, *args: Any) -> list[Any]:
        out = getattr(self.worker, method)(*args)  # a worker method by name, as on Ray: pause, resume, ...
        return [await out if asyncio.iscoroutine(out) else out]

    async def live(self) -> list[dict[str, Any]]:
        return self.worker.live()

    async def close(self) -> None:
        await self.worker.shutdown()
