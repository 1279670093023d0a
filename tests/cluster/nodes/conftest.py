"""Two separate machines beside the session's head (``machines.Machine``), and a run of a config on them from a
driver on the head: what a user with a head and two sandbox nodes would type."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cluster.dev.machines import Machine, Registry

PROJECT = Path(__file__).resolve().parents[3]
SANDBOX = {"sandbox": 1.0}


def need_machines() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("dockerd"):
        why = "separate machines need root, unshare and dockerd"
        pytest.fail(why) if os.environ.get("ROLLOUT_REQUIRE_DOCKER") else pytest.skip(why)


@pytest.fixture
def head_files(tmp_path_factory) -> Path:
    """A directory only the head has (masked on every machine): datasets and run directories go here."""
    return tmp_path_factory.mktemp("head-only")


def start_machines(ray_cluster, head_files: Path, *resources: dict[str, float]):
    """One machine per ``resources`` (one CPU each, an empty image store, the head's files masked), with Serve
    stopped first so the run starts it as a run across machines does (listening for the other machines)."""
    need_machines()
    from ray import serve

    serve.shutdown()
    address = ray_cluster.get_runtime_context().gcs_address
    started = []
    try:
        for index, offered in enumerate(resources, start=1):
            started.append(new_machine(address, head_files, index, offered).start())
        yield started
    finally:
        for machine in started:
            machine.stop()


def new_machine(address: str, head_files: Path, index: int, offered: dict[str, float]) -> Machine:
    """A machine (not started) of one CPU offering ``offered``, the head's files masked; ``index`` names its
    bridge's subnet, one per machine alive at once."""
    name = f"machine_{uuid.uuid4().hex[:6]}"
    return Machine(name, index, address, Path("/tmp") / f"rollout-farm-{name}", num_cpus=1, resources=offered,
                   masked=[str(head_files), str(PROJECT / "runs")])


@pytest.fixture
def two_machines(ray_cluster, head_files, base_image):
    """Two sandbox nodes."""
    yield from start_machines(ray_cluster, head_files, SANDBOX, SANDBOX)


@pytest.fixture
def one_machine(ray_cluster, head_files, base_image):
    """One sandbox node (a second joins in the test that needs it)."""
    yield from start_machines(ray_cluster, head_files, SANDBOX)


@pytest.fixture
def model_and_sandbox_machines(ray_cluster, head_files, base_image):
    """A model node (no sandboxes) and a sandbox node."""
    yield from start_machines(ray_cluster, head_files, {"model_node": 1.0}, SANDBOX)


def run_on_cluster(address: str, head_files: Path, *extra: str, env: dict[str, str] | None = None,
                   config: str = "swe_demo.yaml") -> subprocess.Popen:
    """``python -m cluster run configs/swe_demo.yaml`` from a driver on the head, joined to ``address``, with
    workers on sandbox nodes only and the dataset and run directory where only the head sees them."""
    dataset = head_files / "datasets" / "swe_mini.jsonl"
    command = [sys.executable, "-m", "cluster", "run", str(PROJECT / "configs" / config),
               f"farm.address={address}", "farm.node_resources={sandbox: 1}", f"dataset.path={dataset}",
               f"output.dir={head_files / 'run'}", "run.progress_interval=5", *extra]
    environment = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT), **(env or {})}
    environment.pop("RAY_ADDRESS", None)
    log = open(head_files / "driver.log", "w")  # a file, not a pipe: a long run never blocks on its output
    process = subprocess.Popen(command, cwd=head_files, env=environment, stdout=log, stderr=subprocess.STDOUT,
                               text=True)
    process.log_path = log.name
    return process


def output(process: subprocess.Popen) -> str:
    return Path(process.log_path).read_text(errors="replace")


def results(head_files: Path, run: str = "run") -> list[dict]:
    path = head_files / run / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_registry(root: Path, users: dict[str, str] | None = None) -> Registry:
    if not shutil.which("docker-registry"):
        why = "the registry tests need Debian's docker-registry package"
        pytest.fail(why) if os.environ.get("ROLLOUT_REQUIRE_DOCKER") else pytest.skip(why)
    return Registry(root, users).start()


@pytest.fixture
def registry(tmp_path):
    running = start_registry(tmp_path)
    yield running
    running.stop()
