"""What the live page shows of one run directory (``RunView.state``): live.json as ``rollout status`` reads it
(stalled rollouts flagged, slots in use by node, each node's adaptive limit over time), the new lines of
results.jsonl (reward mean, the first message of each failure type), and a history of samples kept in memory for the
charts."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rollout.store.live import RUNNING, live_condition, read_live
from rollout.store.progress import count_by, format_progress

HISTORY_LIMIT = 2000
"""Samples kept for the charts; past it every other old one is dropped."""
RATE_WINDOW = 30.0
"""Seconds over which the charted throughput (rollouts per minute) is measured."""


class RunView:
    """One run directory seen by the page. ``state()`` is cheap to call once a second: results.jsonl is read
    from where the last call stopped."""

    def __init__(self, run_dir: str | Path, stall: float = 60.0):
        self.run_dir = Path(run_dir)
        self.stall = stall
        self.latest: dict[tuple[str, int], dict[str, Any]] = {}
        """The last results.jsonl line of each (task, sample): the one that counts."""
        self.first_messages: dict[str, str] = {}
        self.history: list[tuple[float, int, float | None, float | None]] = []
        """(time, done, rollouts per minute, reward mean) samples, one per new live.json; a page opened late starts
        with one per result already written (``backfill``)."""
        self.finishes: list[tuple[float, tuple[str, int], dict[str, Any]]] = []
        """(when written, key, line) of the results.jsonl lines read, for ``backfill``; emptied once it ran."""
        self._offset = 0
        self._size = 0
        self._lock = threading.Lock()

    def state(self, now: float | None = None) -> dict[str, Any]:
        """The page's data: the run's state and progress, its in-flight rollouts, outcomes, failures, nodes, history."""
        with self._lock:
            now = time.time() if now is None else now
            self._read_results()
            try:
                doc = read_live(self.run_dir)
            except (FileNotFoundError, ValueError):
                doc = None
            return self._state(doc, now)

    def _state(self, doc: dict[str, Any] | None, now: float) -> dict[str, Any]:
        rewards = [r["reward"] for r in self.latest.values() if r["status"] == "completed" and r["reward"] is not None]
        reward_mean = sum(rewards) / len(rewards) if rewards else None
        failed = [r for r in self.latest.values() if r["status"] != "completed"]
        if doc is None:
            state, why = "unknown", "no live.json: the run has not started, or an older version ran it"
            doc = {"done": len(self.latest), "total": len(self.latest), "in_flight": [], "infra_failed": len(failed),
                   "outcomes": count_by(r["exit_reason"] for r in self.latest.values() if r["status"] == "completed"),
                   "failures_by_type": count_by(self._error_type(r) for r in failed)}
        else:
            state, why = live_condition(doc, now)
        running = state == RUNNING
        rows = [self._row(r, now, running) for r in (doc.get("in_flight") or [])] if running else []
        self.backfill()
        self._sample(doc, now if running else float(doc.get("updated_at") or now), reward_mean)
        failures = doc.get("failures_by_type") or {}
        t, done, per_minute, reward = (list(c) for c in zip(*self.history)) if self.history else ([], [], [], [])
        return {
            "run_id": doc.get("run_id", self.run_dir.name), "run_dir": str(self.run_dir), "state": state, "why": why,
            "now": now, "updated_at": doc.get("updated_at"),
            "done": doc.get("done", 0), "total": doc.get("total", 0), "rate": doc.get("rate") or 0.0,
            "eta_seconds": doc.get("eta_seconds"), "elapsed": doc.get("elapsed"),
            "progress_line": format_progress(doc, len(rows) + int(doc.get("queued") or 0) if running else None)
            if "done" in doc and "total" in doc else "",
            "queued": int(doc.get("queued") or 0) if running else 0,
            "in_flight": rows, "stalled": sum(r["stalled"] for r in rows), "stall_seconds": self.stall,
            "outcomes": doc.get("outcomes") or {}, "infra_failed": doc.get("infra_failed", 0),
            "failures": [{"type": kind, "count": count, "first_message": self.first_messages.get(kind, "")}
                         for kind, count in failures.items()],
            "nodes": nodes(rows, doc.get("limits")),
            "limits": limit_series(doc.get("limits"), now if running else float(doc.get("updated_at") or now)),
            "reward_mean": reward_mean, "scored": len(rewards),
            "history": {"t": t, "done": done, "per_minute": per_minute, "reward_mean": reward},
        }

    def _row(self, row: dict[str, Any], now: float, running: bool) -> dict[str, Any]:
        started, progress = row.get("started"), row.get("last_progress")
        idle = now - progress if progress else None
        return {"task_id": row.get("task_id", ""), "sample_index": row.get("sample_index", 0),
                "attempt": row.get("attempt", 1), "step": row.get("step", 0), "last_command": row.get("last_command"),
                "elapsed": now - started if started else None, "idle": idle,
                "node": (row.get("node_id") or "")[:12] or "local", "worker": row.get("worker") or "",
                "stalled": bool(running and idle is not None and idle >= self.stall)}

    def backfill(self) -> None:
        """A page opened after results were written (a finished run's, or one opened mid-run) charts them where they
        happened: one history point per results.jsonl line already read, at the time it was written, with the done
        count and the reward mean as of then. Runs once, before the first sample; lines without ``finished_at``
        (written by an older version) give no points."""
        finishes, self.finishes = sorted(self.finishes, key=lambda item: item[0]), []
        if self.history or not finishes:
            return
        latest: dict[tuple[str, int], dict[str, Any]] = {}
        for at, key, line in finishes:
            latest[key] = line
            rewards = [r["reward"] for r in latest.values() if r.get("status") == "completed"
                       and r.get("reward") is not None]
            self._point(at, len(latest), sum(rewards) / len(rewards) if rewards else None)

    def _sample(self, doc: dict[str, Any], at: float, reward_mean: float | None) -> None:
        """One history point per new live.json (the first one also gets the run's start)."""
        done = int(doc.get("done") or 0)
        if not self.history and doc.get("started_at") and "ran" in doc:
            self.history.append((float(doc["started_at"]), done - int(doc["ran"]), 0.0, None))
        self._point(at, done, reward_mean)

    def _point(self, at: float, done: int, reward_mean: float | None) -> None:
        """A history point at ``at`` (after the last one), with the throughput over the ``RATE_WINDOW`` before it."""
        if self.history and self.history[-1][0] >= at:
            return
        window = [p for p in self.history if p[0] >= at - RATE_WINDOW] or self.history[-1:]
        per_minute = 60.0 * (done - window[0][1]) / (at - window[0][0]) if window else None
        self.history.append((at, done, per_minute, reward_mean))
        if len(self.history) > HISTORY_LIMIT:
            self.history = self.history[: HISTORY_LIMIT // 2: 2] + self.history[HISTORY_LIMIT // 2:]

    def _read_results(self) -> None:
        """The complete lines appended to results.jsonl since the last call (all of it again if it shrank)."""
        path = self.run_dir / "results.jsonl"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < self._size:  # repaired or moved aside (--new-run): start over
            self._offset, self.latest, self.first_messages = 0, {}, {}
        self._size = size
        if size <= self._offset:
            return
        with open(path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1  # a torn last line (mid-append) waits for the next call
        self._offset += end
        for raw in data[:end].splitlines():
            try:
                line = json.loads(raw)
                key = (str(line["task_id"]), int(line.get("sample_index", 0)))
            except (ValueError, KeyError, TypeError):
                continue
            self.latest[key] = line
            if isinstance(line.get("finished_at"), (int, float)) and not self.history:
                self.finishes.append((float(line["finished_at"]), key, line))
            if line.get("status") != "completed":
                error = line.get("error") or {}
                self.first_messages.setdefault(self._error_type(line), str(error.get("message") or "")[:500])

    @staticmethod
    def _error_type(line: dict[str, Any]) -> str:
        return (line.get("error") or {}).get("type") or str(line.get("exit_reason") or "unknown")


def nodes(rows: list[dict[str, Any]], limits: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Slots in use by node (an in-flight rollout holds one), how many worker processes hold them, and the node's
    adaptive limit now (None without ``farm.adaptive``; a node with a limit is listed with nothing in flight too)."""
    used = Counter(r["node"] for r in rows)
    workers: dict[str, set[str]] = {}
    for r in rows:
        workers.setdefault(r["node"], set()).add(r["worker"])
    now = {node_id[:12]: limit for node_id, limit in (limits or {}).items()}
    return [{"node": node, "in_use": used.get(node, 0), "workers": len(workers.get(node, ())),
             "limit": now[node]["limit"] if node in now else None, "capacity": now.get(node, {}).get("capacity")}
            for node in sorted(set(used) | set(now))]


def limit_series(limits: dict[str, dict[str, Any]] | None, until: float) -> dict[str, Any]:
    """Each node's adaptive limit over time, as the chart draws it: one time axis (each node's start, every change,
    and ``until``) and each node's limit at those times (None before its start)."""
    steps: dict[str, list[tuple[float, int]]] = {}
    for node_id, limit in sorted((limits or {}).items()):
        changes = limit.get("changes") or []
        first = (changes[0]["old"] if changes else limit["limit"])
        began = float(limit.get("started_at") or 0.0) if limit.get("changed", 0) <= len(changes) else None
        points = [(began if began is not None else float(changes[0]["at"]), first)]
        steps[node_id[:12]] = points + [(float(c["at"]), int(c["new"])) for c in changes]
    times = sorted({t for points in steps.values() for t, _ in points} | ({until} if steps else set()))
    series = []
    for node, points in steps.items():
        values, k, current = [], 0, None
        for t in times:
            while k < len(points) and points[k][0] <= t:
                current, k = points[k][1], k + 1
            values.append(current)
        series.append({"node": node, "limit": values})
    return {"t": times, "nodes": series}


def dumps(state: dict[str, Any]) -> bytes:
    return json.dumps(state, default=str, allow_nan=False).encode("utf-8")
