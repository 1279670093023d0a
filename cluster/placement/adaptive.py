"""Adaptive limits per node (``farm.adaptive``): how many rollouts a node runs at once, found by measuring instead of
guessed. Past what a node's CPUs can serve, more sandboxes at once only add contention (on 2 cores, 64 docker
sandboxes at once finished 0.98 rollouts/s, 16 at once 1.18), so each node's limit starts low, grows by a step while
the node's completions per second rise or hold, and is cut (x0.7) when they fall clearly or when its sandboxes'
start latency climbs well above its earlier level: AIMD, as TCP finds a link's rate. Never below 1, never above the
node's capacity (its slots, themselves bounded by ``run.concurrency``).

``AdaptiveLimit`` is one node's controller, pure logic: fed (time, seconds, start seconds) per finished rollout and
asked for its ``limit``; every change is kept with why. ``NodeLimits`` holds one per node for the Ray backend and
shares each limit among the node's workers.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from cluster.placement.slots import Node, split
from rollout.records import RolloutResult

WINDOW = 10.0
"""Seconds a window lasts at least (``farm.adaptive_window``); longer when the node's rollouts take longer, and until
it holds ``MIN_FINISHED`` rollouts started under the limit in force (those finishing just after a change ran mostly
under the one before)."""
MIN_FINISHED = 4
"""Rollouts a window holds at least before it is judged: fewer say nothing about a rate."""
START_PER_CPU = 2
START_MIN = 4
"""A node's limit starts at ``START_PER_CPU`` rollouts per CPU, at least ``START_MIN`` (at most its capacity)."""
STEP_PER_CPU = 1
"""The limit grows by one rollout per CPU of the node (at least one) each window its completions/s rise or hold."""
BACKOFF = 0.7
"""The limit is multiplied by this when completions/s fall clearly or start latency climbs."""
FALL = 0.15
"""Completions/s below ``1 - FALL`` of the best window since the last cut fall clearly (less is noise)."""
LATENCY_FACTOR = 2.0
LATENCY_FLOOR = 1.0
"""Start latency climbs when a window's p90 passes ``LATENCY_FACTOR`` x the lowest p90 of the ``LATENCY_MEMORY``
windows before it, or of ``LATENCY_FLOOR`` seconds if that is higher (a start of 0.1 s that takes 0.3 s is no
sign of anything)."""
LATENCY_MEMORY = 10
FULL_SHARE = 0.5
"""A window judges throughput only if at least this share of its rollouts finished while the node ran as many as its
limit: a node with room to spare (the run's last rollouts, or ``run.concurrency`` spread over many nodes) would
measure the demand, not its own rate."""
CHANGES_KEPT = 1000
"""Changes of a node's limit kept (the oldest are dropped; ``AdaptiveLimit.changed`` counts them all)."""


@dataclass
class Change:
    """One change of a node's limit: when (``time.time()``), from, to, and why, in words."""

    at: float
    old: int
    new: int
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"at": round(self.at, 3), "old": self.old, "new": self.new, "why": self.why}


def start_for(cpus: float) -> int:
    return max(START_MIN, int(START_PER_CPU * cpus))


def step_for(cpus: float) -> int:
    return max(1, int(STEP_PER_CPU * cpus))


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


class AdaptiveLimit:
    """One node's limit. ``note`` each rollout that finished there. A window closes once it lasted ``window`` seconds
    (or its rollouts' mean duration, if longer) and holds ``MIN_FINISHED`` rollouts started under the limit in force,
    and is judged on those: their start latency climbed, or the node's completions/s fell clearly below the best
    since the last cut: x``BACKOFF``; else, with room below ``capacity``, +``step``. The window after a cut only
    measures.

    Completions/s are what the node completes running its limit: the limit over the rollouts' mean duration (Little's
    law), measured by its workers. Counting results as they reach the driver would measure how they travel: they come
    in batches, and a window that caught one batch more than the next looks like a fall that is not there."""

    def __init__(self, capacity: int, *, start: int, step: int, window: float = WINDOW, at: float = 0.0):
        self.capacity = max(1, capacity)
        self.start = self.limit = max(1, min(start, self.capacity))
        self.step, self.window = max(1, step), window
        self.started_at = at
        self.changes: list[Change] = []
        self.changed = 0
        """Changes so far, those dropped from ``changes`` included."""
        self._opened = at
        self._finished = self._full = 0
        """Rollouts finished in the window, and how many of them while the node ran as many as its limit."""
        self._seconds: list[float] = []
        self._starts: list[float] = []
        """Durations and start latencies of the window's rollouts started since the limit last changed."""
        self._since = at
        """When the limit last changed: only rollouts started since measure it."""
        self._last_rate: float | None = None
        self._best: float | None = None
        """The best completions/s since the last cut (the window after a cut sets it afresh)."""
        self._settling = False
        """The limit was just cut: the next window only measures the node at its new limit."""
        self._p90s: deque[float] = deque(maxlen=LATENCY_MEMORY)

    def note(self, at: float, seconds: float | None, start: float | None = None, full: bool = True) -> Change | None:
        """A rollout that finished at ``at`` after ``seconds``, its sandbox started in ``start`` seconds (None: not
        counted for start latency, e.g. its image was fetched first), ``full``: the node ran as many as its limit when
        it finished. Returns the change of the limit when this closes a window that changes it."""
        self._finished += 1
        self._full += bool(full)
        if seconds and at - seconds >= self._since:  # started under the limit in force
            self._seconds.append(seconds)
            if start is not None:
                self._starts.append(start)
        measured = len(self._seconds)
        if measured < MIN_FINISHED or at - self._opened < max(self.window, sum(self._seconds) / measured):
            return None
        rate = self.limit * measured / sum(self._seconds)
        starts, full_share = self._starts, self._full / self._finished
        self._opened, self._finished, self._full, self._seconds, self._starts = at, 0, 0, [], []
        return self._judge(at, rate, p90(starts) if len(starts) >= MIN_FINISHED else None, full_share >= FULL_SHARE)

    def _judge(self, at: float, rate: float, start_p90: float | None, full: bool) -> Change | None:
        if start_p90 is not None:
            earlier = max(min(self._p90s), LATENCY_FLOOR) if self._p90s else None
            self._p90s.append(start_p90)
            if earlier is not None and start_p90 > LATENCY_FACTOR * earlier:
                return self._cut(at, f"start p90 {start_p90:.1f} s > {LATENCY_FACTOR:g}× {earlier:.1f} s")
        if not full:  # demand-bound: its rate says nothing about what the node can do
            return None
        last, self._last_rate = self._last_rate, rate
        if self._settling:  # its rollouts ran partly at the old limit: it sets the bar, judged from the next one
            self._settling, self._best = False, rate
            return None
        if self._best is not None and rate < (1 - FALL) * self._best:
            return self._cut(at, f"completions/s {rate:.3g} < {1 - FALL:g}× best {self._best:.3g}")
        self._best = max(self._best or 0.0, rate)
        if self.limit >= self.capacity:
            return None
        new = min(self.capacity, self.limit + self.step)
        trend = f"{rate:.3g}" if last is None else f"{last:.3g} → {rate:.3g}" + (" (holds)" if rate <= last else "")
        return self._set(at, new, f"completions/s {trend}: +{new - self.limit}")

    def _cut(self, at: float, why: str) -> Change | None:
        self._best, self._settling = None, True
        new = max(1, int(self.limit * BACKOFF))
        return self._set(at, new, f"{why}: ×{BACKOFF:g}") if new != self.limit else None

    def _set(self, at: float, new: int, why: str) -> Change:
        change = Change(at, self.limit, new, why)
        self.limit, self._since = new, at
        self.changes.append(change)
        self.changed += 1
        del self.changes[:-CHANGES_KEPT]
        return change

    def report(self, last: int | None = None) -> dict[str, Any]:
        """The limit as summary.json and live.json say it: capacity, start, now, and its changes (the ``last``)."""
        changes = self.changes if last is None else self.changes[-last:]
        return {"capacity": self.capacity, "start": self.start, "started_at": round(self.started_at, 3),
                "limit": self.limit, "changed": self.changed, "changes": [c.as_dict() for c in changes]}


class NodeLimits:
    """The Ray backend's adaptive limits, one per node (off when ``window`` is None): made when a node's workers
    are, fed every attempt that finished there, each limit shared among the node's workers (``Node.limit``)."""

    def __init__(self, window: float | None):
        self.window = window
        self.by_node: dict[str, AdaptiveLimit] = {}

    @property
    def on(self) -> bool:
        return self.window is not None

    def join(self, workers: list[Node], cpus: float, at: float) -> None:
        """A node's workers, made: its limit starts (a node seen again keeps the one it had)."""
        if not self.on or not workers:
            return
        limit = self.by_node.get(workers[0].node_id)
        if limit is None:
            limit = self.by_node[workers[0].node_id] = AdaptiveLimit(
                sum(w.capacity for w in workers), start=start_for(cpus), step=step_for(cpus), window=self.window,
                at=at)
        share(workers, limit.limit)

    def note(self, workers: list[Node], result: RolloutResult, *, held: bool, full: bool,
             at: float) -> Change | None:
        """An attempt that finished on the node of ``workers``: a completed one counts (a failure is no throughput);
        its start counts for latency only if its image was on the node already (``held``: no fetch, no build)."""
        limit = self.by_node.get(workers[0].node_id) if self.on and workers else None
        if limit is None or result.status != "completed":
            return None
        change = limit.note(at, result.timings.get("total"), result.timings.get("reset") if held else None, full)
        if change is not None:
            share(workers, limit.limit)
        return change

    def report(self, last: int | None = None) -> dict[str, dict[str, Any]] | None:
        """Every node's limit by node id (``AdaptiveLimit.report``); None when the limits are off."""
        return {node_id: limit.report(last) for node_id, limit in self.by_node.items()} if self.on else None

    def describe(self) -> str:
        starts = ", ".join(f"node {node_id[:8]} at {limit.start}" for node_id, limit in self.by_node.items())
        return f"each node's limit adapts (farm.adaptive), starting {starts}"


def runs_its_limit(workers: Iterable[Node]) -> bool:
    """Whether a node runs as many rollouts as its limit (its workers' slots): none free, some may wait there."""
    alive = [w for w in workers if w.alive]
    return bool(alive) and sum(w.used for w in alive) >= sum(w.slots for w in alive)


def share(workers: Iterable[Node], limit: int) -> None:
    """Each worker of a node takes its share of the node's limit (as ``Resources.workers`` shares its capacity)."""
    workers = sorted(workers, key=lambda w: w.index)
    for worker, part in zip(workers, split(limit, len(workers))):
        worker.limit = part
