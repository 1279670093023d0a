"""A standing cluster serves many runs: a second run whose ``serve`` section is the same as the kept application's
reuses it instead of deploying again; a changed section deploys anew."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]
PROJECT = Path(__file__).resolve().parents[3]


def run(address: str, where: Path, run_id: str, *extra: str) -> str:
    command = [sys.executable, "-m", "cluster", "run", str(PROJECT / "configs" / "swe_demo.yaml"), f"run_id={run_id}",
               f"farm.address={address}", "runtime.type=local", "serve.keep=true", "serve.name=standing-model",
               "serve.route_prefix=/standing", f"dataset.path={where / 'swe_mini.jsonl'}",
               f"output.dir={where / run_id}", *extra]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=500)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"tasks\s+12\s+\(scored 12, resolved 12\)", out), out[-2000:]
    return out


def test_a_second_identical_run_reuses_the_kept_application(ray_cluster, tmp_path):
    from ray import serve

    address = ray_cluster.get_runtime_context().gcs_address
    try:
        first = run(address, tmp_path, "first")
        assert "serve: deploying scripted application 'standing-model'" in first
        second = run(address, tmp_path, "second")
        assert "is already running from the same model, options and policy: reused" in second
        assert "deploying" not in second
        changed = run(address, tmp_path, "changed", "serve.replicas=1")  # another section: deployed again
        assert "serve: deploying scripted application 'standing-model'" in changed
    finally:
        serve.delete("standing-model")


def demo_run(address: str, where: Path, run_id: str, *extra: str) -> tuple[str, set]:
    """The local demo's first three tasks with its scripted policy on Serve (no ``serve.keep``), joining ``address``."""
    command = [sys.executable, "-m", "cluster", "run", str(PROJECT / "configs" / "local_demo.yaml"), f"run_id={run_id}",
               "fake_server=null", "serve={app: scripted, policy: demo, name: standing-default, "
               "route_prefix: /standing-default}", "dataset.slice=0:3", "run.samples=1", "--address", address,
               *extra]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT), "ROLLOUT_HOME": str(where)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=500)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (where / run_id / "results.jsonl").read_text().splitlines() if line]
    assert len(rows) == 3 and all(r["status"] == "completed" for r in rows), out[-3000:]
    return out, {(r["task_id"], r["reward"]) for r in rows}


REUSED = "is already running from the same model, options and policy: reused"


def test_a_run_on_a_cluster_it_joined_leaves_its_app_for_the_next_one(ray_cluster, tmp_path):
    from ray import serve

    address = ray_cluster.get_runtime_context().gcs_address
    try:
        first, expected = demo_run(address, tmp_path, "first")
        assert "serve: deploying scripted application 'standing-default'" in first
        assert "stays up on this cluster when the run ends" in first
        second, results = demo_run(address, tmp_path, "second")
        assert REUSED in second and "deploying" not in second and results == expected
        # the policy's own setting changed (its answers may differ): deployed again, and right
        changed, results = demo_run(address, tmp_path, "changed", "serve.latency=0.01")
        assert "serve: deploying scripted application 'standing-default'" in changed and REUSED not in changed
        assert results == expected
        # serve.keep=false: the run deletes it at the end, so the next identical run deploys it again
        demo_run(address, tmp_path, "deleting", "serve.latency=0.01", "serve.keep=false")
        again, results = demo_run(address, tmp_path, "again", "serve.latency=0.01")
        assert "serve: deploying scripted application 'standing-default'" in again and results == expected
    finally:
        serve.delete("standing-default")
