"""The in-flight rollouts of one process, one row each (what it does: step, last command, when it last made
progress, where it runs), kept from each rollout's events: a Ray worker's ``RolloutWorker.live`` and the driver's
in-process backends give the same rows, and ``rollout.store.live`` writes them into ``live.json``."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from rollout import events
from rollout.records import RequestMeta

COMMAND_LIMIT = 200
"""Characters of the last command kept per row."""


@dataclass
class LiveRollout:
    """What one in-flight rollout is doing."""

    rollout_id: str
    task_id: str
    sample_index: int
    attempt: int
    started: float = field(default_factory=time.time)
    step: int = 0
    """Steps finished so far."""
    last_command: str | None = None
    last_progress: float = field(default_factory=time.time)
    """When the rollout last emitted an event (a model call, a command, a step): epoch seconds."""


class LiveTracker:
    """The in-flight rollouts of one process, kept up to date by an observer per rollout."""

    def __init__(self, node_id: str = "", worker: str | None = None):
        self.node_id = node_id
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.rollouts: dict[tuple[str, int], LiveRollout] = {}

    def start(self, meta: RequestMeta) -> tuple[str, int]:
        """Track one attempt from now on; returns its key for ``observer`` and ``finish``."""
        key = (meta.rollout_id, meta.attempt)
        self.rollouts[key] = LiveRollout(meta.rollout_id, meta.task_id, meta.sample_index, meta.attempt)
        return key

    def finish(self, key: tuple[str, int]) -> None:
        self.rollouts.pop(key, None)

    def observer(self, key: tuple[str, int]) -> events.Observer:
        """Updates the attempt's row from its events: any event is progress; commands and steps are noted."""

        def observe(event: events.Event) -> None:
            live = self.rollouts.get(key)
            if live is None:
                return
            live.last_progress = time.time()
            if event.kind in (events.ACTION_STARTED, events.ACTION_EXECUTED) and event.data.get("command"):
                live.last_command = str(event.data["command"])[:COMMAND_LIMIT]
            elif event.kind == events.STEP_DONE:
                live.step = int(event.data.get("step", live.step))

        return observe

    def rows(self) -> list[dict[str, Any]]:
        """The rows ``RolloutWorker.live`` returns: the fields of ``LiveRollout`` plus node_id and worker."""
        return [{**vars(r), "node_id": self.node_id, "worker": self.worker} for r in self.rollouts.values()]

    def __len__(self) -> int:
        return len(self.rollouts)
