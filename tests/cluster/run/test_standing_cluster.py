"""A standing cluster serves many runs: a second run whose ``serve`` section is the same as the kept application's
reuses it instead of deploying again; a changed section deploys anew; a run that does not keep its application
takes it away, though it disconnects from the cluster as soon as its rollouts are done."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]
PROJECT = Path(__file__).resolve().parents[3]


def run(address: str, where: Path, run_id: str, *extra: str) -> str:
    command = [sys.executable, "-m", "cluster", "run", str(PROJECT / "configs" / "swe_demo.yaml"), f"run_id={run_id}",
               f"farm.address={address}", "runtime.type=local", "serve.keep=true", "serve.name=standing-model",
               "serve.route_prefix=/standing", f"dataset.path={where / 'swe_mini.jsonl'}",
               "farm.keep_workers_idle=0",  # no worker kept in the session's cluster (test_kept_workers.py: kept ones)
               f"output.dir={where / run_id}", *extra]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=500)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"tasks\s+12\s+\(scored 12, resolved 12\)", out), out[-2000:]
    return out


def test_a_second_identical_run_reuses_the_kept_application(ray_cluster, serve_as_found, tmp_path):
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
        run(address, tmp_path, "not-kept", "serve.keep=false")  # reused, then deleted: the delete reached Serve
        deadline = time.monotonic() + 60
        while "standing-model" in serve.status().applications and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "standing-model" not in serve.status().applications
    finally:
        serve.delete("standing-model")

