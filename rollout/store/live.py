"""The live view of a running job: ``<run_dir>/live.json``, rewritten by the driver about once a second, says
how far the run is and what every in-flight rollout is doing (step, last command, when it last made
progress, where it runs). ``rollout status`` reads it; so can anything else (``read_live``).

The rows of in-flight rollouts have one shape wherever the rollout runs: the driver keeps them from a rollout's
events for in-process backends, and a Ray worker returns the same rows.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

LIVE_FILE = "live.json"
WRITE_INTERVAL = 1.0
"""Seconds between rewrites of live.json (less when the progress interval is shorter)."""
STALE_AFTER = 15.0
"""A running run's live.json older than this (or five write intervals, if longer) means its driver is gone."""
LIMIT_CHANGES = 200
"""Changes of each node's adaptive limit that live.json keeps (the latest; summary.json has them all)."""
RUNNING, FINISHED, INTERRUPTED, FAILED, STALE = "running", "finished", "interrupted", "failed", "stale"


def live_document(
    run_id: str,
    progress: dict[str, Any],
    rows: list[dict[str, Any]],
    *,
    in_flight: int,
    state: str = RUNNING,
    started_at: float,
    interval: float = WRITE_INTERVAL,
    now: float | None = None,
    limits: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """live.json's content. ``progress`` is ``Progress.snapshot()``; ``in_flight`` counts the attempts the
    driver has handed to the backend, so ``queued`` is those not yet running on a worker (waiting for a slot);
    ``limits``: each node's adaptive limit by node id, when the farm has them (``farm.adaptive``)."""
    now = time.time() if now is None else now
    rollouts = sorted((dict(r) for r in rows), key=lambda r: (r.get("started") or 0.0, r.get("rollout_id", "")))
    for r in rollouts:
        r["elapsed"] = round(now - r["started"], 3) if r.get("started") else None
        r["idle"] = round(now - r["last_progress"], 3) if r.get("last_progress") else None
    return {
        "run_id": run_id,
        "state": state,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": started_at,
        "updated_at": now,
        "write_interval": interval,
        **progress,
        "queued": max(in_flight - len(rollouts), 0),
        "in_flight": rollouts,
        **({"limits": limits} if limits else {}),
    }


def live_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LIVE_FILE


def write_live(run_dir: str | Path, doc: dict[str, Any]) -> Path:
    """Atomically (tmp + rename): a reader never sees half a file."""
    path = live_path(run_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1, default=str)
    os.replace(tmp, path)
    return path


def read_live(run_dir: str | Path) -> dict[str, Any]:
    """The run's live.json (raises FileNotFoundError when the run never wrote one)."""
    return json.loads(live_path(run_dir).read_text(encoding="utf-8"))


def live_condition(doc: dict[str, Any], now: float | None = None) -> tuple[str, str]:
    """The run's state as a reader sees it, and why: a ``running`` file whose writer has stopped updating
    it (or whose process is gone, when on this host) is ``stale``."""
    now = time.time() if now is None else now
    state = doc.get("state", RUNNING)
    age = now - float(doc.get("updated_at") or 0.0)
    if state != RUNNING:
        return state, f"{format_age(age)} ago"
    pid, host = doc.get("pid"), doc.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        return STALE, f"its driver (pid {pid} on {host}) is gone; last update {format_age(age)} ago"
    limit = max(STALE_AFTER, 5 * float(doc.get("write_interval") or WRITE_INTERVAL))
    if age > limit:
        return STALE, f"no update for {format_age(age)} (driver pid {pid} on {host}): the driver is gone or stuck"
    return RUNNING, f"driver pid {pid} on {host}, updated {format_age(age)} ago"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def format_age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
