"""The farm on two Ray nodes with real containers: per-node slots hold, every node works, and a node that
crashes mid-run costs its in-flight rollouts one attempt each, never a result or a container.

The cluster (``ray.cluster_utils.Cluster``: a head and a worker node, 2 CPUs each) lives in a subprocess,
``multinode_run.py``, which runs the job in-process, kills the worker node half way and prints a JSON report.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("multinode_run.py")
DATASET = REPO / "configs" / "data" / "local_demo.jsonl"
SHELL_TASKS = 3  # the demo dataset's default-profile tasks
SAMPLES = 8
SLOTS_PER_NODE = 4  # 2 CPUs per node / farm.cpus_per_rollout 0.5

CONFIG = """\
run_id: {run_id}
serve: {{app: scripted, in_process: true, policy: demo, latency: 0.5}}
model: {{type: openai, model: scripted, max_retries: 3}}
agent: {{type: mini_swe, max_steps: 12}}
environment: {{type: shell, command_timeout: 10, setup_from_task: true}}
runtime: {{type: docker, image: {image}, cpus: 0.5, memory: 256m}}
verifier: {{type: check_command}}
dataset: {{path: {dataset}, pattern: "^shell-"}}
run: {{samples: {samples}, concurrency: 16, max_attempts: 3, progress_interval: 2}}
farm: {{cpus_per_rollout: 0.5}}
output: {{dir: {run_id}}}
"""


def processes_under(directory: str) -> list[int]:
    """Pids of the live processes whose command line names ``directory`` (the cluster's Ray processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if directory in cmdline:
            pids.append(int(entry.name))
    return pids


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_run_containers(run_id: str) -> None:
    """What a killed script could not remove (its Ray workers died before their cleanup)."""
    listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=rollout-farm.run={run_id}"],
                            capture_output=True, text=True)
    if listed.stdout.split():
        subprocess.run(["docker", "rm", "-f", *listed.stdout.split()], capture_output=True)


def stray_processes(directory: str, wait: float = 30.0) -> list[int]:
    """The cluster's processes still alive once its workers had ``wait`` seconds to notice their raylet
    is gone (a worker exits on its own about a second after)."""
    until = time.monotonic() + wait
    while (pids := processes_under(directory)) and time.monotonic() < until:
        time.sleep(0.5)
    return pids


@pytest.mark.docker
@pytest.mark.ray
@pytest.mark.slow
def test_two_nodes_keep_their_slots_and_a_crashed_node_costs_only_a_retry(base_image, tmp_path):
    run_id = f"multinode-{os.getpid()}"
    config = tmp_path / "multinode.yaml"
    config.write_text(CONFIG.format(run_id=run_id, image=base_image, dataset=json.dumps(str(DATASET)),
                                    samples=SAMPLES))
    # Short: Unix socket paths under it must stay within the kernel's 107 bytes.
    ray_tmpdir = tempfile.mkdtemp(prefix="rf-ray-")
    env = {**os.environ, "ROLLOUT_HOME": str(tmp_path / "runs"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(config), "--ray-tmpdir", ray_tmpdir,
                             "--kill-after", str(2 * SLOTS_PER_NODE)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        try:
            stdout, stderr = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(f"the multi-node run did not finish:\n{stderr[-4000:]}")
        assert proc.returncode == 0, stderr[-4000:]
        report = json.loads(stdout.strip().splitlines()[-1])
        context = f"report: {json.dumps(report, indent=1)}\nstderr tail:\n{stderr[-3000:]}"
        head, worker = report["head_node"], report["worker_node"]
        assert report["sampler_error"] is None and report["kill_error"] is None, context

        # slots: never more containers on a node than its CPUs allow; both nodes ran rollouts
        assert set(report["max_live_per_node"]) == {head, worker}, context
        assert all(1 <= n <= SLOTS_PER_NODE for n in report["max_live_per_node"].values()), context
        assert report["max_live_per_node"][head] == SLOTS_PER_NODE, context  # its slots were all used
        assert report["completed_per_node"].get(head, 0) >= 1, context
        assert report["completed_per_node"].get(worker, 0) >= 1, context

        # the crash: it happened with rollouts in flight there, and the run still completed every rollout
        assert report["killed_at"] is not None and report["in_flight_on_killed_node"] >= 1, context
        assert report["reported_dead_at"] is not None, context
        expected = {f"{task}#{s}" for task in ("shell-hello", "shell-count-lines", "shell-fix-script")
                    for s in range(SAMPLES)}
        assert len(expected) == SHELL_TASKS * SAMPLES == report["planned"]
        assert report["final"] == {key: "completed" for key in expected}, context
        # each rollout the crash interrupted: a worker_died attempt on the dead node, then a completed one
        assert report["retried"], context
        for key, attempts in report["retried"].items():
            died = [i for i, a in enumerate(attempts) if a["exit_reason"] == "worker_died"]
            assert died, (key, context)
            assert all(attempts[i]["status"] == "infra_failed" and attempts[i]["node_id"] == worker
                       for i in died), (key, context)
            assert attempts[-1]["status"] == "completed" and attempts[-1]["node_id"] == head, (key, context)
        # one completed line per rollout, and none of the run's containers are left
        assert sum(report["completed_per_node"].values()) == len(expected), context
        assert report["leftover_containers"] == 0, context

        assert stray_processes(ray_tmpdir) == [], "Ray processes of the test's cluster outlived it"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_all(processes_under(ray_tmpdir))
        remove_run_containers(run_id)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
