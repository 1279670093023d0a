"""A run's Ray cluster at its end: the embedded one it started is gone by the time the run returns (stopped while
its outputs are written, not at the interpreter's exit); a cluster it joined keeps running for its owner."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "local_demo.yaml"
SMALL = ["dataset.slice=0:1", "run.samples=1", "farm.backend=ray", "farm.num_cpus=1", "--new-run"]

pytestmark = [pytest.mark.ray]

IN_A_PROCESS_OF_ITS_OWN = r'''
import asyncio, io, json, os, sys
from pathlib import Path
from cluster.run import job as jobs

args = sys.argv[1:]
job = jobs.prepare([args[0]], [a for a in args[1:] if a != "--new-run"], new_run=True, out=io.StringIO())
summary = asyncio.run(jobs.execute(job))
import ray
tmp = os.environ["RAY_TMPDIR"]
left = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if tmp in line and int(pid) != os.getpid():
        left.append(line[:200])
print(json.dumps({"completed": summary["rollouts"]["completed"], "initialized": ray.is_initialized(),
                  "owns": job.owns_cluster, "left": left}))
'''


def test_a_run_stops_the_cluster_it_started_before_it_returns(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Ray's own temp dir, short (its socket paths must fit), names every process of this cluster on its command line.
    ray_tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")
    env.update(ROLLOUT_HOME=str(tmp_path), RAY_TMPDIR=ray_tmp)
    try:
        done = subprocess.run([sys.executable, "-c", IN_A_PROCESS_OF_ITS_OWN, str(DEMO), *SMALL], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["completed"] == 1
    assert report["initialized"] is False and report["owns"] is False
    assert report["left"] == [], report["left"]  # raylet, GCS, monitor, workers: none outlives the run


def test_a_run_on_a_cluster_already_running_in_its_process_leaves_it_running(ray_cluster, tmp_path, monkeypatch):
    from cluster.run import job as jobs

    ray = ray_cluster
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path))
    job = jobs.prepare([str(DEMO)], [a for a in SMALL if a not in ("farm.num_cpus=1", "--new-run")], new_run=True,
                       out=io.StringIO())
    summary = asyncio.run(jobs.execute(job))
    assert summary["rollouts"]["completed"] == 1
    assert ray.is_initialized()
    assert ray.get(ray.put("still here")) == "still here"
