"""``farm.adaptive`` on the session's Ray cluster: a run whose node's limit moves completes every rollout, never has
more running on the node than its limit at the time, and says where the limit ended (summary.json, the summary's
table, the job's log, the live page's data)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from test_farm_faults import lines, run_job_in_thread, write_run

from cluster.web.live_page import start_for_run
from rollout.store.summary import format_table

pytestmark = [pytest.mark.ray]

N_TASKS, CONCURRENCY = 160, 24
GRACE = 2.0
"""Seconds a worker may still start a rollout under a limit the driver just lowered (the news is on its way)."""
EDGE = 0.05
"""Seconds within which one rollout's end and the next one's start are the same moment (each is timed from its
first model call, a few milliseconds after its true start, more on a busy machine)."""


def spans(run_dir: Path, rows: list[dict]) -> list[tuple[float, float]]:
    """(start, end) of each rollout as its worker timed it: its first model call less its environment's reset."""
    out = []
    for row in rows:
        doc = json.loads((run_dir / row["trajectory_path"]).read_text())
        start = doc["trajectory"]["steps"][0]["started_at"] - row["timings"]["reset"]
        out.append((start, start + row["timings"]["total"]))
    return out


def limit_at(limit: dict, t: float) -> int:
    """The most the node's limit allowed in the ``GRACE`` seconds up to ``t``."""
    allowed, now = limit["start"], limit["start"]
    for change in limit["changes"]:
        if change["at"] > t:
            break
        now = change["new"]
        allowed = max(now, change["old"]) if change["at"] > t - GRACE else now
    return allowed


@pytest.mark.slow
def test_an_adaptive_run_moves_the_nodes_limit_keeps_under_it_and_reports_it(ray_cluster, tmp_path):
    runtime = {"type": "null", "echo": True, "delay": 0.3}  # three commands of 0.3 s a rollout
    config = write_run(tmp_path, "adaptive", n_tasks=N_TASKS, pause=0, runtime=runtime,
                       farm={"backend": "ray", "adaptive": True, "adaptive_window": 1.0})
    thread, box = run_job_in_thread(config, [f"run.concurrency={CONCURRENCY}", "run.max_attempts=1"])
    thread.join(120)
    assert not thread.is_alive(), "the run ended"
    run_dir = tmp_path / "runs" / "adaptive"
    rows = lines(run_dir)
    assert len(rows) == N_TASKS and all(r["status"] == "completed" for r in rows)

    summary = json.loads((run_dir / "summary.json").read_text())
    ((node_id, limit),) = summary["adaptive"].items()
    assert (limit["capacity"], limit["start"]) == (CONCURRENCY, 8), "2 per CPU of the node's 4"
    assert limit["changed"] >= 1 and limit["changes"] and 1 <= limit["limit"] <= CONCURRENCY
    assert max(c["new"] for c in limit["changes"]) > limit["start"], "it grew while throughput did"
    first = limit["changes"][0]
    log = box["out"].getvalue()
    assert f"[farm] node {node_id[:8]}: limit {first['old']} → {first['new']} ({first['why']})" in log
    assert "each node's limit adapts (farm.adaptive)" in log
    (row,) = [line for line in format_table(summary).splitlines() if line.startswith("adaptive limit")]
    assert f"node {node_id[:8]} ended at {limit['limit']} (started at 8, at most {CONCURRENCY}" in row

    ran = spans(run_dir, rows)
    for start, _ in ran:
        others = [(s - start, e - start) for s, e in ran if s < start - EDGE and start + EDGE < e]
        assert len(others) < limit_at(limit, start), f"{len(others)} ran when one more started: {sorted(others)}"
    assert max(sum(1 for s, e in ran if s <= t < e) for t, _ in ran) > limit["start"], "it ran more than at first"

    page = start_for_run(run_dir)
    try:
        with urllib.request.urlopen(page.url + "api/state", timeout=10) as reply:
            state = json.loads(reply.read())
    finally:
        page.stop()
    (series,) = state["limits"]["nodes"]
    assert series["node"] == node_id[:12] and series["limit"][0] == 8 and series["limit"][-1] == limit["limit"]
    assert len(state["limits"]["t"]) >= 2 + min(limit["changed"], 1)
    assert [(n["node"], n["limit"], n["capacity"]) for n in state["nodes"]] == [
        (node_id[:12], limit["limit"], CONCURRENCY)]
