"""The SWE demo on a head and two separate machines (their own docker daemons with empty image stores, the head's
files masked): every image and file a rollout needs reaches its node with no hand step, and a machine that dies
mid-run costs nothing but time."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess

import pytest
from separate_machines import (
    PROJECT,
    SANDBOX,
    finished,
    new_machine,
    output,
    replica_nodes,
    results,
    run_on_cluster,
    start_registry,
)

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

LABEL = "rollout-farm.run"


def assert_whole(head_files, expected: int = 12) -> list[dict]:
    """Every rollout finished once: one completed attempt per task (0 lost, 0 duplicated). ``results.jsonl`` logs
    every attempt; an earlier one may only be an infrastructure failure, never a task outcome. The final rows."""
    rows = results(head_files)
    done = collections.Counter(r["rollout_id"] for r in rows if r["status"] == "completed")
    assert len(done) == expected and set(done.values()) == {1}, done
    earlier = [r for r in rows if r["status"] != "completed"]
    assert all(r["status"] == "infra_failed" and r["error"]["retryable"] for r in earlier), earlier
    assert all(max(f["attempt"] for f in rows if f["rollout_id"] == r["rollout_id"]) == r["attempt"]
               for r in rows if r["status"] == "completed")  # nothing ran after its completed attempt
    return [r for r in rows if r["status"] == "completed"]


def labelled(machine) -> list[str]:
    done = machine.docker("ps", "-aq", "--filter", f"label={LABEL}")
    return done.stdout.split()


def test_the_demo_and_harbor_tasks_resolve_on_fresh_machines_with_images_through_the_object_store(
        ray_cluster, two_machines, head_files):
    address = ray_cluster.get_runtime_context().gcs_address
    out = finished(run_on_cluster(address, head_files))
    assert "resolved 12" in out or "resolved rate   1.000" in out, out[-3000:]
    rows = assert_whole(head_files)
    assert all(r["reward"] == 1.0 for r in rows), [(r["task_id"], r.get("exit_reason")) for r in rows]
    nodes = {r["node_id"] for r in rows}
    machine_nodes = {m.node_id() for m in two_machines}
    assert nodes <= machine_nodes and len(nodes) == 2, (nodes, machine_nodes)  # the head ran none
    for machine in two_machines:
        images = machine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert "rollout-farm/base:bookworm" in images  # loaded, not pre-loaded
        assert labelled(machine) == []
    # Harbor tasks on the same machines: the task directories (and their packed archives) only on the head, each
    # task's image built on the node that runs it from the archive that travelled with the task.
    tasks = shutil.copytree(PROJECT / "configs" / "harbor" / "tasks", head_files / "harbor-tasks")
    run = run_on_cluster(address, head_files, f"dataset.path={tasks}", f"output.dir={head_files / 'harbor-run'}",
                         config="harbor.yaml", env={"ROLLOUT_FARM_CACHE": str(head_files / "cache")})
    out = finished(run)
    rows = [r for r in results(head_files, "harbor-run") if r["status"] == "completed"]
    assert len(rows) == len(list(tasks.iterdir())) and all(r["reward"] == 1.0 for r in rows), out[-3000:]
    assert {r["node_id"] for r in rows} <= machine_nodes
    assert any(t.startswith("rollout-farm/harbor:") for m in two_machines
               for t in m.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())


def image_id(docker, image: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()


def head_docker(*args: str):
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


def test_the_demo_resolves_on_fresh_machines_with_images_from_a_registry(ray_cluster, two_machines, head_files,
                                                                         registry):
    import sys


    dataset = head_files / "datasets"
    subprocess.run([sys.executable, "-m", "envs.swe.mini", str(dataset)], check=True, cwd=PROJECT,
                   capture_output=True)
    prefix = f"{registry.address}/farm"
    pushed = subprocess.run([sys.executable, "-m", "cluster", "images", "build", str(dataset / "swe_mini.jsonl"),
                             "--registry", prefix], cwd=PROJECT, capture_output=True, text=True, timeout=900)
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    assert pushed.stdout.count(f"to {prefix}") == 13  # the base image and 12 instance images
    address = ray_cluster.get_runtime_context().gcs_address
    finished(run_on_cluster(address, head_files, f"images.registry={prefix}", "images.through_ray=false"))
    rows = assert_whole(head_files)
    assert all(r["reward"] == 1.0 for r in rows)
    for machine in two_machines:
        ran = {r["task_id"] for r in rows if r["node_id"] == machine.node_id()}
        assert ran, "each machine ran rollouts"
        tags = machine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        instance = next(t for t in tags if t.startswith("rollout-farm/instance:"))
        # pulled, not built here: the very image the head built (a local build would have another id)
        assert image_id(machine.docker, instance) == image_id(head_docker, instance)
        assert not any(t.startswith(registry.address) for t in tags)  # kept under the image's own name
        assert labelled(machine) == []
    # the trainer API on the same machines, from this process: tasks whose bundles only the head has
    from cluster import RolloutFarm
    from rollout.data.dataset import load_tasks

    tasks = load_tasks(dataset / "swe_mini.jsonl")[:3]
    overrides = ["farm.node_resources={sandbox: 1}", f"images.registry={prefix}", "serve.name=trainer-across",
                 "serve.route_prefix=/trainer-across"]
    with RolloutFarm.from_config(str(PROJECT / "configs" / "swe_demo.yaml"), overrides) as farm:
        batch = farm.generate(tasks, n=2)
    assert batch.rewards == [[1.0, 1.0]] * 3, batch.describe()
    ran_on = {r.node_id for group in batch.groups for r in group.results}
    assert ran_on and ran_on <= {m.node_id() for m in two_machines}


def test_a_wrong_registry_credential_is_one_error_before_work_starts(ray_cluster, machines, head_files, tmp_path):

    guarded = start_registry(tmp_path, machines.network, users={"farm": "right-password"})
    try:
        address = ray_cluster.get_runtime_context().gcs_address
        secret = "wrong-password-7d1f"
        run = run_on_cluster(address, head_files, f"images.registry={guarded.address}/farm",
                             env={"ROLLOUT_REGISTRY_USERNAME": "farm", "ROLLOUT_REGISTRY_PASSWORD": secret})
        run.wait(timeout=300)
        out = output(run)
    finally:
        guarded.stop()
    assert run.returncode == 2, out[-3000:]
    assert "images.registry" in out and "refused the credentials" in out
    assert secret not in out
    assert not (head_files / "run" / "results.jsonl").exists() or results(head_files) == []


def results_reach(run, head_files, count: int, timeout: float = 600) -> None:
    """Wait until the run has written ``count`` result lines (or ended)."""
    import time

    path, deadline = head_files / "run" / "results.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.5)


def test_a_machine_that_dies_mid_run_loses_nothing(ray_cluster, two_machines, head_files):
    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, "run.max_attempts=3")
    survivor, victim = two_machines
    results_reach(run, head_files, 6)  # about half way
    assert run.poll() is None, "the run ended before the machine could be killed"
    lost = victim.node_id()
    victim.kill()
    assert victim.container_pids() == []  # its containers went with it
    out = finished(run)
    rows = assert_whole(head_files)  # 0 lost, 0 duplicated: every task once, completed
    assert all(r["reward"] == 1.0 for r in rows)
    assert f"node {lost[:8]} left the cluster" in out, out[-3000:]
    assert re.search(rf"node lost\s+{lost[:8]}: [1-9]\d* attempts ran again elsewhere", out), out[-3000:]
    assert any(r["node_id"] == survivor.node_id() for r in rows)
    assert labelled(survivor) == []


def test_a_node_whose_docker_daemon_dies_gets_no_more_rollouts(ray_cluster, two_machines, head_files):
    import os
    import signal

    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, "run.max_attempts=3")
    survivor, victim = two_machines
    results_reach(run, head_files, 4)
    sick = victim.node_id()
    os.kill(int((victim.root / "docker.pid").read_text()), signal.SIGKILL)  # the daemon only: its raylet lives
    out = finished(run)
    rows = assert_whole(head_files)
    assert all(r["reward"] == 1.0 for r in rows)
    assert f"node {sick[:8]}: 2 sandboxes in a row did not start" in out, out[-3000:]
    failed_there = [r for r in results(head_files) if r["status"] != "completed" and r["node_id"] == sick]
    assert len(failed_there) <= 4, failed_there  # the rollouts it had, and two starts: no retry storm


def test_the_model_tier_runs_apart_from_the_sandboxes(ray_cluster, model_and_sandbox_machines, head_files):
    import time

    model, sandbox = model_and_sandbox_machines
    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, config="across_machines.yaml")  # the README's config for this
    replicas: set[str] = set()
    deadline = time.monotonic() + 400
    while run.poll() is None and time.monotonic() < deadline:
        replicas |= set(replica_nodes())
        time.sleep(1)
    out = finished(run)
    rows = assert_whole(head_files)
    assert all(r["reward"] == 1.0 for r in rows)
    assert replicas == {model.node_id()}  # every replica on the model node
    assert {r["node_id"] for r in rows} == {sandbox.node_id()}  # every rollout on the sandbox node, none on the head
    url = re.search(r"answers at (http://[^/]+)/v1", out).group(1)
    assert "127.0.0.1" not in url and "localhost" not in url, url  # an address the other machines reach


def test_a_machine_that_joins_mid_run_gets_rollouts(ray_cluster, machines, one_machine, head_files):
    """A sandbox node started while a run goes on: the driver sees it at its next look at the node list, starts a
    worker there, and the node's first rollouts run while the first node's continue (its images fetched anew)."""
    import time

    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, "run.samples=2")  # 24 rollouts: work left when the node is up
    (first,) = one_machine
    results_reach(run, head_files, 2)
    assert run.poll() is None, "the run ended before a machine could join"
    joined = new_machine(address, head_files, SANDBOX, machines.network).start()
    try:
        up, there = time.monotonic(), []
        while run.poll() is None and not there:
            there = [r for r in results(head_files) if r["node_id"] == joined.node_id()]
            time.sleep(0.5)
        print(f"the joined node's first result {time.monotonic() - up:.1f}s after it was up")
        finished(run)
        rows = assert_whole(head_files, expected=24)
        on_joined = [r for r in rows if r["node_id"] == joined.node_id()]
        assert on_joined and all(r["reward"] == 1.0 for r in rows), collections.Counter(r["node_id"] for r in rows)
        assert any(r["node_id"] == first.node_id() for r in rows)
        assert labelled(joined) == [] and labelled(first) == []
    finally:
        joined.stop()
