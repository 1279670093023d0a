"""The model tier's outages during a run: a thread in the driver looks at Serve's details every few seconds and
follows the application's replicas by id. A replica seen running that is no longer running (a model node that died,
a replica that crashed) is lost, even when its replacement was already up by that look; an outage is the stretch
from the look that saw a loss, or fewer running than the target, to the look that sees the target running again.
The run's summary gives them (``model tier``).

Each look waits for the controller at most ``TIMEOUT`` seconds: a controller busy with a dead node must not hold
the look past the outage it would have seen."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cluster.session.ray_private import serve_details

INTERVAL = 2.0
"""Seconds between two looks at the application's replicas."""
TIMEOUT = 5.0
"""Seconds one look waits for Serve's controller (a look that gets no answer is skipped)."""


@dataclass(frozen=True)
class Look:
    """What one look saw of an application: its target replica count, the ids running, and the ids Serve lists as
    recently dead."""

    target: int
    running: frozenset[str] = field(default_factory=frozenset)
    dead: frozenset[str] = field(default_factory=frozenset)


class ReplicaWatch:
    def __init__(self, app: str, interval: float = INTERVAL):
        self.app, self.interval = app, interval
        self.full = 0
        """The tier's size: the target replica count once it was whole."""
        self.outages: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        """Every replica id seen running."""
        self._running: frozenset[str] = frozenset()
        self._lost: set[str] = set()
        """The replicas counted lost (each once)."""
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
            self._thread.join(timeout=TIMEOUT + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                look = look_at(self.app, TIMEOUT)
            except Exception:  # noqa: BLE001 - the controller itself may be moving, or slow: the next look says
                continue
            if look is not None:
                self.note(look, time.monotonic())

    def note(self, look: Look, now: float) -> None:
        """One look at ``now`` (monotonic seconds)."""
        lost = {rid for rid in (self._running - look.running) | (look.dead & self._seen) if rid not in self._lost}
        self._lost |= lost
        self._seen |= look.running
        self._running = look.running
        whole = len(look.running) >= look.target
        open_outage = self.outages[-1] if self.outages and self.outages[-1]["seconds"] is None else None
        if self.full and open_outage is None and (lost or not whole):
            open_outage = {"at": round(now - self._began, 1), "lost": 0, "seconds": None}
            self.outages.append(open_outage)
        if open_outage is not None:
            open_outage["lost"] = max(open_outage["lost"] + len(lost), self.full - len(look.running))
            if whole:
                open_outage["seconds"] = round(now - self._began - open_outage["at"], 1)
        if whole:
            self.full = max(self.full, look.target)

    def report(self) -> dict[str, Any] | None:
        """``{"replicas": n, "outages": [{"at", "lost", "seconds"}]}`` (``seconds`` None: not whole again by the
        end; 0: the replacement was up by the look that saw the loss), or None when nothing was lost."""
        return {"replicas": self.full, "outages": list(self.outages)} if self.outages else None


def look_at(app: str, timeout: float) -> Look | None:
    """What Serve's details say of ``app``'s replicas now (every deployment of the application); None when it has
    no such application (not deployed yet, or deleted)."""
    application = serve_details(timeout).get("applications", {}).get(app)
    if application is None:
        return None
    target, running, dead = 0, set(), set()
    for deployment in application.get("deployments", {}).values():
        target += deployment.get("target_num_replicas") or 0
        running |= {r["replica_id"] for r in deployment.get("replicas", []) if r.get("state") == "RUNNING"}
        dead |= {r["replica_id"] for r in deployment.get("recent_dead_replicas") or []}
    return Look(target, frozenset(running), frozenset(dead))
