"""Faults a farm run meets, end to end with a run directory: a worker actor killed mid-run, an attempt
that outlives its host-side deadline, and the driver SIGKILLed half way (its own Ray, in a subprocess)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "local_demo.yaml"

pytestmark = [pytest.mark.ray]


def write_run(tmp_path: Path, run_id: str, n_tasks: int, pause: float, **sections) -> Path:
    data = tmp_path / f"{run_id}.jsonl"
    with open(data, "w") as f:
        for k in range(n_tasks):
            f.write(json.dumps({"task_id": f"t{k}", "prompt": "Write your seed.",
                                "data": {"check": "test -s seed.txt", "pause": pause}}) + "\n")
    config = {
        "run_id": run_id,
        "model": {"type": "scripted", "policy": "seed_writer"},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell", "command_timeout": 60},
        "verifier": {"type": "check_command"},
        "dataset": {"path": str(data)},
        "run": {"concurrency": 8, "max_attempts": 2, "progress_interval": 1},
        "output": {"dir": str(tmp_path / "runs" / run_id)},
        **sections,
    }
    path = tmp_path / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_job_in_thread(config: Path, overrides=()) -> tuple[threading.Thread, dict]:
    from cluster.run import job as jobs

    box: dict = {"out": io.StringIO()}
    job = jobs.prepare([str(config)], list(overrides), out=box["out"])
    box["job"] = job

    def target() -> None:
        box["summary"] = asyncio.run(jobs.execute(job))

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


def labelled(run_id: str) -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=rollout-farm.run={run_id}"],
                          capture_output=True, text=True).stdout.split()


def lines(run_dir: Path) -> list[dict]:
    path = run_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def final_per_key(rows: list[dict]) -> dict:
    latest = {}
    for r in rows:
        latest[(r["task_id"], r["sample_index"])] = r
    return latest


@pytest.mark.docker
@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_nothing_and_leaves_no_container(ray_cluster, base_image, tmp_path):
    ray = ray_cluster
    runtime = {"type": "docker", "image": base_image, "cpus": 0.5, "memory": "256m"}
    config = write_run(tmp_path, "kill-worker", n_tasks=12, pause=2.0, runtime=runtime)
    thread, box = run_job_in_thread(config)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(labelled("kill-worker")) < 2:
            time.sleep(0.1)
        named = [a for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("rollout-worker:kill-worker:")]
        assert named, "the run's worker actor is named after the run"
        victim = ray.get_actor(named[0]["name"], namespace=named[0]["namespace"])
        ray.kill(victim, no_restart=True)
    finally:
        thread.join(300)
    assert not thread.is_alive()
    summary = box["summary"]
    rows = lines(tmp_path / "runs" / "kill-worker")
    final = final_per_key(rows)
    assert len(final) == 12 and all(r["status"] == "completed" and r["reward"] == 1.0 for r in final.values())
    assert summary["rollouts"] == {"total": 12, "completed": 12, "infra_failed": 0}
    died = [r for r in final.values() if any(a["exit_reason"] == "worker_died" for a in r["attempts"])]
    assert died, "the killed worker's rollouts ran again"
    for r in died:
        assert [a["status"] for a in r["attempts"]] == ["infra_failed", "completed"]
    assert Counter((r["task_id"], r["sample_index"], r["attempt"]) for r in rows).most_common(1)[0][1] == 1
    assert "died" in box["out"].getvalue() and "replacement" in box["out"].getvalue()
    assert labelled("kill-worker") == []


@pytest.mark.docker
@pytest.mark.slow
def test_the_host_side_deadline_cancels_an_attempt_and_removes_its_container(ray_cluster, base_image, tmp_path):
    runtime = {"type": "docker", "image": base_image, "cpus": 0.5, "memory": "256m"}
    config = write_run(tmp_path, "deadline", n_tasks=1, pause=600, runtime=runtime,
                       farm={"backend": "ray", "deadline": 8})
    t0 = time.monotonic()
    thread, box = run_job_in_thread(config, ["run.max_attempts=1"])
    thread.join(120)
    took = time.monotonic() - t0
    (row,) = lines(tmp_path / "runs" / "deadline")
    assert row["status"] == "infra_failed" and row["exit_reason"] == "deadline_exceeded"
    assert "8s deadline" in row["error"]["message"] and row["reward"] is None
    assert took < 60, "the attempt was cut at its deadline, not after the 600 s command"
    assert labelled("deadline") == []
    assert "deadline per attempt: 8s" in box["out"].getvalue()


def test_sigkill_of_the_driver_half_way_then_the_same_command_gives_one_result_each(tmp_path):
    pytest.importorskip("ray")
    # This driver's own embedded cluster, found again by its temp dir (short: Ray's socket paths must fit).
    ray_tmp = Path(tempfile.mkdtemp(prefix="rf-ray-", dir="/tmp"))
    env = {**os.environ, "ROLLOUT_HOME": str(tmp_path / "home"), "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "cluster", "run", str(DEMO), "serve.latency=0.3", "run.concurrency=2"]
    run_dir = tmp_path / "home" / "local_demo"
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(lines(run_dir)) < 4:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = len(lines(run_dir))
        assert 4 <= killed_at < 16, "the kill should land half way"
        again = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "ray: started an embedded local cluster" in again.stderr
        keys = Counter((r["task_id"], r["sample_index"]) for r in lines(run_dir))
        assert len(keys) == 16 and set(keys.values()) == {1}
    finally:
        stray = _processes_mentioning(str(ray_tmp))
        for pid in stray:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert stray == [], "the killed driver's Ray processes went down with it"


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ray", "local"])
def test_sigkill_of_a_docker_runs_driver_leaves_no_container_10s_later(base_image, tmp_path, backend):
    if backend == "ray":
        pytest.importorskip("ray")
    run_id = f"kill-driver-{backend}"
    runtime = {"type": "docker", "image": base_image, "cpus": 0.25, "memory": "256m"}
    config = write_run(tmp_path, run_id, n_tasks=8, pause=120, runtime=runtime, farm={"backend": backend})
    ray_tmp = Path(tempfile.mkdtemp(prefix="rf-ray-", dir="/tmp"))
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "cluster", "run", str(config), "run.concurrency=4"], env=env,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and len(labelled(run_id)) < 2 and proc.poll() is None:
            time.sleep(0.1)
        assert len(labelled(run_id)) >= 2, "the run's rollouts are in flight in their containers"
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=30)
        while time.monotonic() - killed < 10 and labelled(run_id):
            time.sleep(0.1)
        left = labelled(run_id)
        print(f"{backend}: containers gone {time.monotonic() - killed:.2f}s after the driver's SIGKILL")
    finally:
        for pid in _processes_mentioning(str(ray_tmp)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        subprocess.run(["docker", "rm", "-f", *labelled(run_id)], capture_output=True)
    assert left == [], "10 s after the driver's SIGKILL its run's containers are gone"
