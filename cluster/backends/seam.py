"""The backend seam: what the driver and ``RolloutFarm`` use of the place rollouts run (in this process, or on
Ray workers). ``execute`` is required; the others have the defaults of a backend without them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from rollout.events import Observer
from rollout.records import RequestMeta, RolloutResult, Task


class Backend(ABC):
    @abstractmethod
    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        """One attempt of one (task, sample), as a result (failures included: it never raises for a rollout)."""

    async def live(self) -> list[dict[str, Any]] | None:
        """The in-flight rollouts as live.json rows; None: the driver tracks them from the rollouts' events."""
        return None

    def note_queue(self, not_started: int) -> None:
        """How many rollouts wait to start (a metric); ignored by default."""

    async def broadcast(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every worker (pause, resume, set_policy_version); the trainer API needs it."""
        raise NotImplementedError(f"{type(self).__name__} has no workers to call {method} on")

    async def close(self) -> None:
        """Stop what the backend started."""
