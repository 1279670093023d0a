"""The numbers behind a finished run's report.html and summary.png, from its results.jsonl (the latest line per
task and sample) and summary.json: reward, duration and turn distributions, outcomes, infrastructure failures by
type with their first message, and per task its successes (for SWE runs: resolved instances)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rollout.store.files import parse_results
from rollout.store.progress import count_by
from rollout.store.resume import latest_per_key
from rollout.store.summary import summarize

PER_TASK_LIMIT = 60
"""Tasks shown one by one in the per-task panel (SWE: resolved by instance); past it, the first ones by id."""


def collect(run_dir: str | Path, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report draws, as plain JSON (also inlined into report.html)."""
    run_dir = Path(run_dir)
    latest = latest_per_key(parse_results(run_dir / "results.jsonl").results)
    if summary is None:
        summary = _read_json(run_dir / "summary.json") or summarize(latest)
    completed = [r for r in latest if r.status == "completed"]
    failed = [r for r in latest if r.status != "completed"]
    threshold = float(summary.get("success_threshold") or 1.0)
    swe = any("resolved" in r.reward_details for r in latest)
    per_task: dict[str, list[int]] = {}
    for r in latest:
        wins = per_task.setdefault(r.task_id, [0, 0])
        wins[1] += 1
        if r.status == "completed" and (swe or r.reward is not None):  # no verdict: no win, no loss
            wins[0] += int(bool(r.reward_details.get("resolved")) if swe else r.reward >= threshold)
    first: dict[str, str] = {}
    for r in failed:
        first.setdefault(r.error.type if r.error else r.exit_reason.value,
                         (r.error.message if r.error else "")[:300])
    shown = sorted(per_task)[:PER_TASK_LIMIT]
    return {
        "run_id": summary.get("run_id") or run_dir.name,
        "run_dir": str(run_dir),
        "swe": swe,
        "summary": summary,
        "rewards": histogram([r.reward for r in completed if r.reward is not None]),
        "durations": histogram([r.timings["total"] for r in latest if r.timings.get("total") is not None]),
        "turns": histogram([max(r.num_steps, len(r.trajectory.steps)) for r in completed], integers=True),
        "outcomes": count_by(r.exit_reason.value for r in completed),
        "failures": count_by(r.error.type if r.error else r.exit_reason.value for r in failed),
        "first_messages": first,
        "per_task": {"title": "resolved by instance" if swe else f"successes by task (reward >= {threshold:g})",
                     "tasks": shown, "wins": [per_task[t][0] for t in shown],
                     "samples": [per_task[t][1] for t in shown], "hidden": len(per_task) - len(shown)},
    }


def histogram(values: list[float], bins: int = 12, integers: bool = False) -> dict[str, Any]:
    """Counts of ``values`` in equal bins: ``{"centers", "counts", "width", "n", "mean"}`` (one bin per value
    for integers over a short range; one bin when every value is the same)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"centers": [], "counts": [], "width": 1.0, "n": 0, "mean": None}
    low, high = min(values), max(values)
    if integers and high - low < 40:
        width, edges0, count = 1.0, low - 0.5, int(high - low) + 1
    elif high == low:
        width, edges0, count = 1.0 if low == 0 else abs(low) / 5, low, 1
        edges0 -= width / 2
    else:
        width, edges0, count = (high - low) / bins, low, bins
    counts = [0] * count
    for v in values:
        counts[min(int((v - edges0) / width), count - 1)] += 1
    return {"centers": [edges0 + width * (i + 0.5) for i in range(count)], "counts": counts, "width": width,
            "n": len(values), "mean": sum(values) / len(values)}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
