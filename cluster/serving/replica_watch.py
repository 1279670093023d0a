"""The model tier's outages during a run: a thread in the driver asks Serve every few seconds how many of the
application's replicas run, and records each stretch with fewer than it had (a model node that died, a replica that
crashed) and how long until as many ran again. The run's summary gives them (``model tier``)."""

from __future__ import annotations

import threading
import time
from typing import Any

INTERVAL = 2.0
"""Seconds between two looks at the application's replicas."""


class ReplicaWatch:
    def __init__(self, app: str, interval: float = INTERVAL):
        self.app, self.interval = app, interval
        self.full = 0
        """The most replicas seen running at once: what the tier has when nothing is lost."""
        self.outages: list[dict[str, Any]] = []
        self._began = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ReplicaWatch":
        self._thread = threading.Thread(target=self._loop, name=f"replica-watch-{self.app}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                running = running_replicas(self.app)
            except Exception:  # noqa: BLE001 - the controller itself may be moving: the next look says
                continue
            self.note(running, time.monotonic())

    def note(self, running: int, now: float) -> None:
        """One look: ``running`` replicas at ``now`` (monotonic seconds)."""
        open_outage = self.outages[-1] if self.outages and self.outages[-1]["seconds"] is None else None
        if open_outage is not None:
            open_outage["lost"] = max(open_outage["lost"], self.full - running)
            if running >= self.full:
                open_outage["seconds"] = round(now - self._began - open_outage["at"], 1)
        elif running < self.full:
            self.outages.append({"at": round(now - self._began, 1), "lost": self.full - running, "seconds": None})
        self.full = max(self.full, running)

    def report(self) -> dict[str, Any] | None:
        """``{"replicas": n, "outages": [{"at", "lost", "seconds"}]}`` (``seconds`` None: not whole again by the
        end), or None when nothing was lost."""
        return {"replicas": self.full, "outages": list(self.outages)} if self.outages else None


def running_replicas(app: str) -> int:
    """The replicas of ``app`` Serve reports running now (every deployment of the application)."""
    from ray import serve  # the ray extra, as every Serve call of this folder

    application = serve.status().applications.get(app)
    if application is None:
        return 0
    return sum(count for overview in application.deployments.values()
               for state, count in overview.replica_states.items() if state == "RUNNING")  # a str enum
