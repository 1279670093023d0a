"""Many sandboxes on one node: a burst of 128 rollouts sent at once, each in its own docker container, goes through
the engine's start queue without an engine error or an infrastructure failure, and the run's summary says how many
ran at once."""

from __future__ import annotations

import json
import statistics

import pytest
from test_farm_faults import labelled, lines, run_job_in_thread, write_run

pytestmark = [pytest.mark.ray]

BURST = 128


@pytest.mark.docker
@pytest.mark.slow
def test_128_rollouts_started_at_once_on_one_node_meet_no_engine_error(ray_cluster, base_image, tmp_path, capfd):
    """The session's one node (4 logical CPUs) takes all 128 at once: the farm's keys reserve 1/128 of its CPUs and
    64m per rollout (the defaults, 1/32 CPU and 128m, take 128 on 4 CPUs too, but the node's memory might not)."""
    runtime = {"type": "docker", "image": base_image, "cpus": 0.5, "memory": "128m"}
    config = write_run(tmp_path, "burst", n_tasks=BURST, pause=4.0, runtime=runtime,
                       farm={"backend": "ray", "cpus_per_rollout": 4 / BURST, "memory_per_rollout": "64m"})
    thread, box = run_job_in_thread(config, [f"run.concurrency={BURST}", "run.max_attempts=1"])
    thread.join(600)
    assert not thread.is_alive(), "the burst ended"
    rows = lines(tmp_path / "runs" / "burst")
    assert len(rows) == BURST
    assert [r["status"] for r in rows] == ["completed"] * BURST, {r["error"]["message"] for r in rows if r["error"]}
    assert all(r["reward"] == 1.0 for r in rows)
    summary = json.loads((tmp_path / "runs" / "burst" / "summary.json").read_text())
    assert summary["concurrency"] == {"asked": BURST, "reached": BURST}
    assert "run.concurrency asks" not in box["out"].getvalue()  # nothing refused: no line saying why
    assert "engine failed a container start" not in capfd.readouterr().err  # not even one retried
    starts = sorted(r["timings"]["reset"] for r in rows)
    print(f"container start under a burst of {BURST}: p50 {statistics.median(starts):.1f} s, "
          f"p99 {starts[int(0.99 * (BURST - 1))]:.1f} s")
    assert labelled("burst") == []
