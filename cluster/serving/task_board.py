"""The tasks of a trainer's calls, where the scripted Serve app's replicas find them: a policy that reads its task
(``gold``, ``oracle``) looks it up by the request's task id, first in the run's dataset, then here (Ray's internal
key-value store, one key per task under the application's name), so ``RolloutFarm.generate`` can hand any task."""

from __future__ import annotations

from typing import Any, Iterable

from cluster.session.ray_private import kv_del, kv_get, kv_keys, kv_put
from rollout.records import Task

PREFIX = "rollout-farm/tasks/"


def _key(app: str, task_id: str) -> bytes:
    return f"{PREFIX}{app}/{task_id}".encode()


def post_tasks(app: str, tasks: Iterable[Task]) -> None:
    """Publish tasks for the replicas of ``app`` (a task id posted again replaces it)."""
    for task in tasks:
        kv_put(_key(app, task.task_id), task.model_dump_json().encode())


def clear_tasks(app: str) -> None:
    for key in kv_keys(f"{PREFIX}{app}/"):
        kv_del(key)


class BoardTasks(dict[str, Task]):
    """A replica's task lookup: the dataset's tasks, else the board's (read on each miss, so a task posted for a
    later call is seen; a task id the board does not have is None, as for an unknown task)."""

    def __init__(self, app: str, tasks: dict[str, Task] | None = None):
        super().__init__(tasks or {})
        self.app = app

    def get(self, task_id: Any, default: Task | None = None) -> Task | None:
        if task_id in self:
            return self[task_id]
        if not task_id:
            return default
        raw = kv_get(_key(self.app, str(task_id)))
        return Task.model_validate_json(raw) if raw else default
