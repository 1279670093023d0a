"""Separate machines beside the session's head (``machines.Machine``) and runs of a config on them from a driver on
the head: the helpers of this folder's tests and of the fixtures in ``conftest.py`` (which holds only fixtures, as a
module named ``conftest`` is any folder's)."""

from __future__ import annotations

import collections
import itertools
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cluster.session.machines import Machine, Registry
from cluster.session.netns import Network
from cluster.session.ray_private import serve_details

PROJECT = Path(__file__).resolve().parents[3]
SANDBOX = {"sandbox": 1.0}
MODEL = {"model_node": 1.0}
_indexes = itertools.count(1)
"""A machine's index names its bridge's subnet: one per machine of the session, never reused."""
drivers: list[subprocess.Popen] = []
"""The runs started by ``run_on_cluster`` (a fixture kills any still going after its test)."""


def need_machines() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("dockerd"):
        why = "separate machines need root, unshare and dockerd"
        pytest.fail(why) if os.environ.get("ROLLOUT_REQUIRE_DOCKER") else pytest.skip(why)


def new_machine(address: str, head_files: Path, offered: dict[str, float], network: Network) -> Machine:
    """A machine (not started) of one CPU offering ``offered`` at an address of its own on ``network``,
    ``head_files`` and the project's runs masked; its daemon pulls from a registry on that network."""
    name = f"machine_{uuid.uuid4().hex[:6]}"
    return Machine(name, next(_indexes), address, Path("/tmp") / f"rollout-farm-{name}", num_cpus=1,
                   resources=offered, masked=[str(head_files), str(PROJECT / "runs")], network=network,
                   insecure_registries=[REGISTRIES])


REGISTRIES = "10.199.0.0/16"
"""Where the tests' registries listen (a network's gateway): plain HTTP, allowed on every daemon (``.ci/run`` adds it
to the main one's ``daemon.json``)."""


class Machines:
    """The session's machines, by what each offers, on a network of their own (``network``)."""

    def __init__(self, address: str, head_root: Path):
        self.address, self.head_root = address, head_root
        self.live: list[tuple[dict[str, float], Machine]] = []
        self.network = Network.for_process().create()

    def lend(self, *offers: dict[str, float]) -> list[Machine]:
        """A machine offering each of ``offers``, in that order, as fresh as a new one. Live machines that are not
        healthy, or that offer sandboxes beyond those asked for, are stopped (killed first, so Ray's wait for their
        nodes runs while the new ones start); a machine of another kind (a model node) is left running: no sandbox
        lands on it."""
        wanted, kept, gone = list(offers), [], []
        for offered, machine in self.live:
            if not healthy(machine) or (offered == SANDBOX and offered not in wanted):
                gone.append(killed(machine))
                continue
            if offered in wanted:
                wanted.remove(offered)
            kept.append((offered, machine))
        try:
            for offered in wanted:
                kept.append((offered, new_machine(self.address, self.head_root, offered, self.network).start()))
        finally:
            self.live = kept
            for machine in gone:
                machine.stop()
        lent, free = [], list(self.live)
        for offered in offers:
            pair = next(pair for pair in free if pair[0] == offered)
            free.remove(pair)
            lent.append(emptied(pair[1]))
        return lent

    def stop(self) -> None:
        """Every machine killed at once, then stopped (Ray's waits for their nodes overlap)."""
        for _offered, machine in self.live:
            killed(machine)
        for _offered, machine in self.live:
            machine.stop()
        self.live = []
        self.network.delete()


def killed(machine: Machine) -> Machine:
    """``machine`` killed, its mount namespace forgotten: once the namespace's last process is gone the kernel may
    give its number to the next machine's, which a later ``kill`` or ``stop`` by that number would kill."""
    if machine.process is None or machine.process.poll() is not None:
        machine.namespace = None  # dead already (a test killed it): its number may be another machine's by now
    machine.kill()
    machine.namespace = None
    return machine


def healthy(machine: Machine) -> bool:
    return (machine.process is not None and machine.process.poll() is None and machine.joined()
            and machine.answers())


def emptied(machine: Machine) -> Machine:
    """``machine`` with no container and no image left in its daemon's store: as a new machine's."""
    containers = machine.docker("ps", "-aq").stdout.split()
    if containers:
        machine.docker("rm", "-f", *containers, timeout=120)
    machine.docker("system", "prune", "-af", "--volumes", timeout=300)
    left = machine.docker("images", "-aq").stdout.split() + machine.docker("ps", "-aq").stdout.split()
    assert left == [], f"machine {machine.name} kept {left} after a prune"
    return machine


def lend(machines: Machines, *offers: dict[str, float]) -> list[Machine]:
    from ray import serve

    serve.shutdown()  # the run starts it, listening for the other machines
    return machines.lend(*offers)


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
    drivers.append(process)
    return process


def finished(process: subprocess.Popen, timeout: float = 600) -> str:
    """The driver's output once it ended well; an ``AssertionError`` with its tail if it failed or ran past
    ``timeout`` seconds (then it is killed)."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the run did not end within {timeout:g}s: {output(process)[-4000:]}") from None
    out = output(process)
    assert process.returncode == 0, out[-4000:]
    return out


def output(process: subprocess.Popen) -> str:
    return Path(process.log_path).read_text(errors="replace")


def results(head_files: Path, run: str = "run") -> list[dict]:
    path = head_files / run / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_registry(root: Path, network: Network, users: dict[str, str] | None = None) -> Registry:
    """A registry at ``network``'s gateway, where the machines and this host's daemon both reach it."""
    why = None
    if not shutil.which("docker-registry"):
        why = "the registry tests need Debian's docker-registry package"
    elif REGISTRIES not in subprocess.run(["docker", "info", "--format", "{{json .RegistryConfig}}"],
                                          capture_output=True, text=True, timeout=60).stdout:
        why = f"this host's docker daemon does not allow plain-HTTP registries on {REGISTRIES} (insecure-registries)"
    if why:
        pytest.fail(why) if os.environ.get("ROLLOUT_REQUIRE_DOCKER") else pytest.skip(why)
    return Registry(root, network.gateway, users).start()


def replica_nodes(app: str = "rollout-model") -> dict[str, int]:
    """The running replicas of ``app`` per node id (none before the run started Serve)."""
    try:
        details = serve_details(timeout=30)
    except Exception:  # noqa: BLE001 - Serve not started yet by the run
        return {}
    found: dict[str, int] = collections.Counter()
    for deployment in details.get("applications", {}).get(app, {}).get("deployments", {}).values():
        for replica in deployment.get("replicas", []):
            if replica.get("state") == "RUNNING":
                found[replica["node_id"]] += 1
    return dict(found)
