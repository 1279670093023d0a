"""Events the rollout loop emits, and the fan-out to observers (progress, metrics, live views).

Observers are plain callables ``observer(event)``; they run inline, so they must be cheap. An
observer that raises is logged and ignored: watching a rollout never breaks it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

ROLLOUT_STARTED = "rollout_started"
ENV_READY = "env_ready"
"""The environment's reset finished (a container started, a repo checked out): ``seconds``."""
MODEL_CALL_DONE = "model_call_done"
ACTION_STARTED = "action_started"
"""The environment is about to run a step's actions: ``step``, ``command`` (the first action's command or name)."""
ACTION_EXECUTED = "action_executed"
STEP_DONE = "step_done"
VERIFY_DONE = "verify_done"
"""The verifier (SWE grading in a fresh container) finished: ``seconds``, ``reward``."""
ROLLOUT_FINISHED = "rollout_finished"
EVENT_KINDS = (ROLLOUT_STARTED, ENV_READY, MODEL_CALL_DONE, ACTION_STARTED, ACTION_EXECUTED, STEP_DONE, VERIFY_DONE,
               ROLLOUT_FINISHED)


@dataclass
class Event:
    kind: str
    rollout_id: str
    task_id: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


Observer = Callable[[Event], None]


class Emitter:
    """Sends events for one rollout to a list of observers."""

    __slots__ = ("observers", "rollout_id", "task_id")

    def __init__(self, observers: Iterable[Observer] = (), rollout_id: str = "", task_id: str = ""):
        self.observers = list(observers)
        self.rollout_id = rollout_id
        self.task_id = task_id

    def emit(self, kind: str, **data: Any) -> None:
        if not self.observers:
            return
        event = Event(kind, self.rollout_id, self.task_id, data)
        for observer in self.observers:
            try:
                observer(event)
            except Exception:  # noqa: BLE001 - an observer must never break a rollout
                log.exception("observer %r failed on %s", observer, kind)
