"""`ray job submit` against a real head node: the SWE demo, shipped as the job's working dir, runs on the farm,
writes its run directory under ROLLOUT_HOME, and leaves no container behind.

The head node is started with `ray start` from the project's environment in its own session, with its own
temp dir, ports and auth token, and is torn down by process id (never `ray stop`, which would end every Ray
process on the machine, this test session's own included).
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RAY = Path(sys.executable).parent / "ray"
LABEL = "rollout-farm.run"

pytest.importorskip("ray")


def free_ports(count: int) -> list[int]:
    """Distinct ports nobody listens on (all bound at once, so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port_block(size: int = 100) -> int:
    """The first port of ``size`` consecutive free ports below the ephemeral range (for Ray's workers)."""
    rng = secrets.SystemRandom()
    for _ in range(50):
        base = rng.randrange(20000, 32000 - size)
        sockets = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                s.bind(("0.0.0.0", port))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.fail(f"no block of {size} free ports for Ray's workers")


def processes() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (parent pid, session id, state, command line) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        out[int(entry)] = (int(ppid), int(session), state, cmdline)
    return out


def cluster_processes(session: int, marker: str) -> set[int]:
    """Live processes of the head node: its `ray start` session (every Ray process it spawned inherits it),
    anything whose command line names its temp dir, and their descendants. Never this process."""
    table = processes()
    own = {os.getpid()}
    chosen = {pid for pid, (_, sid, state, cmd) in table.items()
              if state != "Z" and (sid == session or marker in cmd)} - own
    grew = True
    while grew:
        children = {pid for pid, (ppid, _, state, _) in table.items()
                    if ppid in chosen and pid not in chosen and state != "Z"} - own
        chosen |= children
        grew = bool(children)
    return chosen


def stop_cluster(session: int, marker: str) -> set[int]:
    """SIGTERM, then SIGKILL what is left, by pid; returns the processes still alive after that."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        targets = cluster_processes(session, marker)
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and cluster_processes(session, marker):
            time.sleep(0.2)
    return cluster_processes(session, marker)


def labelled_containers(run_id: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}={run_id}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.docker
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_swe_demo_as_a_ray_job_on_a_head_node(base_image):
    if not RAY.is_file():
        pytest.skip(f"no ray command next to {sys.executable}")
    # A short path: Ray puts unix sockets under the temp dir, and those are limited to ~107 characters.
    tmp = Path(tempfile.mkdtemp(prefix="rf-rayjob-"))
    home, data = tmp / "home", tmp / "data" / "swe_mini.jsonl"
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    gcs, dashboard, client, agent, agent_grpc, env_agent, metrics = free_ports(7)
    workers = free_port_block()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    base_env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    # The job's driver inherits the raylet's environment: `python` is this environment's, runs go under home.
    head_env = {**base_env, **auth, "ROLLOUT_HOME": str(home),
                "PATH": os.pathsep.join([str(RAY.parent), os.environ.get("PATH", "")])}
    run_id = f"swe_job_{secrets.token_hex(3)}"  # its own label, apart from other runs on this machine

    start = subprocess.Popen(
        [str(RAY), "start", "--head", "--temp-dir", str(tmp / "ray"), "--port", str(gcs),
         "--dashboard-port", str(dashboard), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
         "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(env_agent),
         "--metrics-export-port", str(metrics), "--min-worker-port", str(workers),
         "--max-worker-port", str(workers + 99), "--num-cpus", "2", "--disable-usage-stats"],
        env=head_env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # every process of the head node inherits this session id
    session = start.pid
    try:
        t0 = time.monotonic()
        started, _ = start.communicate(timeout=180)
        start_seconds = time.monotonic() - t0
        assert start.returncode == 0, started[-3000:]

        t0 = time.monotonic()
        job = subprocess.run(
            [str(RAY), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--working-dir", str(REPO),
             "--", "python", "-m", "cluster", "run", "configs/swe_demo.yaml", f"run_id={run_id}",
             f"dataset.path={data}", "dataset.slice=0:3"],
            check=False, env={**base_env, **auth}, cwd=REPO, capture_output=True, text=True, timeout=1080)
        job_seconds = time.monotonic() - t0
        log = job.stdout + job.stderr
        print(f"ray start {start_seconds:.1f}s; job submit to exit {job_seconds:.1f}s")
        assert job.returncode == 0, log[-5000:]

        assert "runtime: docker (a docker daemon answers)" in log
        assert "ray: joined the cluster at " in log  # the head node, not an embedded cluster
        printed = re.findall(r"^run directory: (.+)$", log, re.MULTILINE)
        run_dir = home.resolve() / run_id
        assert printed and {Path(p) for p in printed} == {run_dir}, printed
        rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
        assert len(rows) == 3
        assert all(r["status"] == "completed" and r["exit_reason"] == "submitted" for r in rows)
        assert all(r["reward"] == 1.0 and r["reward_details"]["resolved"] for r in rows)
        assert all(r["node_id"] for r in rows)  # each ran on a worker of the farm

        preds = json.loads((run_dir / "preds.json").read_text())
        assert set(preds) == {r["task_id"] for r in rows}
        for ident, pred in preds.items():
            report_dir = run_dir / "logs" / "run_evaluation" / run_id / pred["model_name_or_path"] / ident
            assert json.loads((report_dir / "report.json").read_text())[ident]["resolved"]
        report = json.loads(next(run_dir.glob(f"*.{run_id}.json")).read_text())
        assert report["resolved_instances"] == 3 and report["unresolved_instances"] == 0
        assert json.loads((run_dir / "summary.json").read_text())["rollouts"]["completed"] == 3
        assert labelled_containers(run_id) == []
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
        left = stop_cluster(session, str(tmp))
        leaked = labelled_containers(run_id)
        if leaked:
            subprocess.run(["docker", "rm", "-f", *leaked], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    assert not left, f"head node processes still alive: {sorted(left)}"
    assert not leaked, f"containers labelled {LABEL}={run_id} left: {leaked}"
