"""The backend seam: what the driver, a run and ``RolloutFarm`` use of the place rollouts run (in this process, or
on Ray workers), and what a backend is built from. ``execute`` is required; every other member has the default of
a backend without it, so callers use it without asking whether it is there."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

from rollout.events import Observer
from rollout.protocols import Model
from rollout.records import RequestMeta, RolloutResult, Task


class WorkerSource(Protocol):
    """What a backend's workers build their rollouts from (``cluster.workers.worker``: a run config's composer, or
    a trainer's objects): one model per worker and each rollout's parts."""

    base_url: str | None
    """Where the model answers, once a served model does (set before the workers start, or told them later)."""

    def build_model(self) -> Model: ...


class Backend(ABC):
    @abstractmethod
    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        """One attempt of one (task, sample), as a result (failures included: it never raises for a rollout)."""

    ahead: int = 0
    """Rollouts the driver may send beyond ``concurrency``: a backend whose workers queue them and start each the
    moment a slot frees takes that many more (0: one sent per slot)."""

    transfers: dict[str, Any] | None = None
    """What reached the nodes during the run (images, files), for the summary; None where nothing travels."""

    kept_workers: dict[str, Any] | None = None
    """Workers kept between runs on a standing cluster: ``{"reused", "started", "idle"}``; None: none kept."""

    def running(self) -> int | None:
        """Rollouts running now, when some of those sent wait on their worker; None: every one sent runs."""
        return None

    def peak_running(self) -> int | None:
        """The most rollouts that ran at once so far, when some of those sent wait on their worker; None: the driver
        counts them (every rollout sent runs)."""
        return None

    def node_limits(self, last: int | None = None) -> dict[str, dict[str, Any]] | None:
        """Each node's adaptive limit by node id (``farm.adaptive``, ``cluster.placement.adaptive``): capacity, start,
        the limit now and its changes (the ``last`` ones); None where slots are fixed."""
        return None

    def lost_nodes(self) -> dict[str, str]:
        """The nodes that left the cluster during the run, by id: why the farm counts each as gone (none for a
        backend in one process)."""
        return {}

    async def set_model_url(self, base_url: str) -> None:
        """The model answers at ``base_url`` now (it deployed while the backend started); a backend that built its
        model from its source before that is told here. By default nothing to tell: the source had it at start."""

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
