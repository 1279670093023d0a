"""The separate-machines fixture cannot silently share: a node's processes find the head's files masked and its
docker daemon's image store empty, and a node that dies is gone with its daemon and every process it had."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from separate_machines import SANDBOX, lend, need_machines

from cluster.session.machines import mount_namespace

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def machine(machines, head_files):
    """One of the session's machines (``conftest.py``), and a file only the head has."""
    (head_files / "rows.jsonl").write_text('{"id": 1}\n')
    (node,) = lend(machines, SANDBOX)
    return node, head_files


def test_a_node_reads_nothing_of_the_head_by_path_and_has_an_image_store_of_its_own(machine):
    import ray

    node, head_files = machine

    @ray.remote(num_cpus=0, resources={node.name: 0.01})
    def on_the_node(path: str) -> dict:
        import os
        import subprocess

        images = subprocess.run(["docker", "images", "-q"], capture_output=True, text=True, timeout=60)
        return {"exists": os.path.exists(path), "host": os.environ.get("DOCKER_HOST"), "err": images.stderr,
                "images": images.stdout.split(), "docker_ok": images.returncode == 0}

    seen = ray.get(on_the_node.remote(str(head_files / "rows.jsonl")), timeout=120)
    assert (head_files / "rows.jsonl").exists()  # on the head it is there
    assert seen["exists"] is False  # on the node it is not: a read by path fails
    assert seen["host"] == node.docker_host and seen["docker_ok"], seen
    assert seen["images"] == []  # the node's daemon starts with nothing
    main = subprocess.run(["docker", "images", "-q"], capture_output=True, text=True, timeout=60)
    assert main.stdout.split(), "the main daemon holds images the node's does not"


def test_a_machine_has_an_address_of_its_own_and_a_loopback_of_its_own(machine):
    """The head reaches the node only at the node's own address, and the node's 127.0.0.1 is not this host's: a
    server on this host's loopback is unreachable from it (a service that binds 127.0.0.1 for other machines is a
    bug the fixture finds)."""
    import socket

    import ray

    node, _ = machine
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    @ray.remote(num_cpus=0, resources={node.name: 0.01})
    def from_the_node(port: int) -> dict:
        import socket

        import ray

        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            reached = "reached"
        except OSError as exc:
            reached = type(exc).__name__
        return {"ip": ray.util.get_node_ip_address(), "host_loopback": reached}

    try:
        seen = ray.get(from_the_node.remote(port), timeout=120)
    finally:
        listener.close()
    assert seen == {"ip": node.address, "host_loopback": "ConnectionRefusedError"}, seen
    (entry,) = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(node.name)]
    assert entry["NodeManagerAddress"] == node.address and not node.address.startswith("127.")
    print(f"machine {node.name} at {node.address}; this host's 127.0.0.1:{port} refused from it")


def test_a_machine_that_dies_takes_its_daemon_and_processes_with_it(machine):
    node, _ = machine
    assert node.answers()
    assert len(node.pids()) >= 3  # the shell's exec'd ray, its raylet and the daemon at least
    node.kill()
    assert node.pids() == []
    assert not node.answers(timeout=20)
    assert node.gone(timeout=90), "Ray still lists the dead machine's node as alive"


def test_dev_cluster_up_status_down(tmp_path):
    """``rollout dev-cluster``: a head and a machine up, seen alive, then down with nothing left behind."""
    import json
    import sys

    need_machines()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "ROLLOUT_HOME": str(tmp_path / "home")}
    env.pop("RAY_ADDRESS", None)

    def rollout(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cluster", "dev-cluster", *args], env=env, capture_output=True,
                              text=True, timeout=300)

    up = rollout("up", "--nodes", "1", "--port", "6393")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((tmp_path / "rollout-farm" / "dev-cluster.json").read_text())
        head_ip = state["address"].rsplit(":", 1)[0]
        assert f"farm.address={head_ip}:6393" in up.stdout and not head_ip.startswith("127.")
        machine_ip = state["machines"][0]["address"]
        assert machine_ip != head_ip and f"at {machine_ip}" in up.stdout
        again = rollout("up")
        assert again.returncode == 2 and "already up" in again.stderr
        status = rollout("status")
        assert f"dev_machine_1: alive at {machine_ip}" in status.stdout, status.stdout + status.stderr
    finally:
        down = rollout("down")
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    namespaces = {m["namespace"] for m in state["machines"]} | {state["head"]["namespace"]}
    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and mount_namespace(p.name) in namespaces]
    assert left == []
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert state["network"]["name"] not in links  # the cluster's bridge, and the machines' links on it
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert state["machines"][0]["name"] not in namespaces
