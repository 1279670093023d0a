"""``rollout dev-cluster up|status|down``: a cluster of separate machines on this one, to try the farm across nodes
on a laptop (root, ``unshare`` and ``dockerd`` needed).

``up --nodes 2``: a network of the cluster's own (a bridge on this host, ``cluster.session.netns``), a Ray head on
its gateway address that runs the driver only, and N sandbox machines (``cluster.session.machines``), each a Ray node
with one CPU (``--cpus``), the resource ``sandbox``, its own network address, its own docker daemon with an empty
image store and its own view of the filesystem where the run home is hidden; it prints the address and the command
to run the SWE demo across them. ``status``: the machines, their addresses and whether each is alive. ``down``:
every machine and the head killed (the cluster's standing workers and kept models with it), their namespaces,
network and files removed. The state is kept in ``~/.cache/rollout-farm/dev-cluster.json``.

Exit codes: 0 done; 1 a machine did not start (what was started is stopped again); 2 bad arguments, or a cluster
is already up (``down`` first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cluster.cli.parser import HelpParser

STATE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-farm" / "dev-cluster.json"
ROOT = Path("/tmp") / "rollout-farm-dev-cluster"


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="rollout dev-cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a head and N separate machines")
    up.add_argument("--nodes", type=int, default=2, help="sandbox machines (default 2)")
    up.add_argument("--cpus", type=int, default=1, help="CPUs of each machine (default 1)")
    up.add_argument("--port", type=int, default=6390, help="the head's GCS port (default 6390)")
    sub.add_parser("status", help="the machines and whether each is alive")
    sub.add_parser("down", help="stop every machine and the head")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return {"up": up, "status": status, "down": down}[args.command](args)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a mount namespace and a docker daemon per machine)"
    for tool in ("unshare", "dockerd", "ip"):
        if not shutil.which(tool):
            return f"needs {tool} on PATH"
    return None


def up(args: argparse.Namespace) -> int:
    problem = _missing() or (f"a dev cluster is already up ({STATE}): `rollout dev-cluster down` first"
                             if STATE.exists() else None) or ("--nodes must be at least 1" if args.nodes < 1 else None)
    if problem:
        print(f"dev-cluster: {problem}", file=sys.stderr)
        return 2
    from cluster.session.home import rollout_home
    from cluster.session.machines import Machine
    from cluster.session.netns import Network

    ROOT.mkdir(parents=True, exist_ok=True)
    network = Network.for_process("rfd").create()
    state = {"address": f"{network.gateway}:{args.port}", "network": network.state(), "head": {}, "machines": []}
    STATE.parent.mkdir(parents=True, exist_ok=True)
    try:
        state["head"] = _start_head(network.gateway, args.port)
    except Exception as exc:  # noqa: BLE001 - remove the network again, say why
        STATE.write_text(json.dumps(state, indent=1))
        print(f"dev-cluster: {exc}", file=sys.stderr)
        down(args)
        return 1
    address = state["address"]
    os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: it reads the mode then
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        for index in range(1, args.nodes + 1):
            machine = Machine(f"dev_machine_{index}", index, address, ROOT / f"machine-{index}", network=network,
                              num_cpus=args.cpus, resources={"sandbox": 1.0}, masked=[str(rollout_home())])
            state["machines"].append(machine.state())  # before it starts: `down` removes a half-made one too
            STATE.write_text(json.dumps(state, indent=1))
            machine.start()
            state["machines"][-1] = machine.state()
            STATE.write_text(json.dumps(state, indent=1))
            print(f"machine {index}: node {machine.node_id()[:8]} at {machine.address}, docker at "
                  f"{machine.docker_host}", flush=True)
    except Exception as exc:  # noqa: BLE001 - stop what started, say why
        STATE.write_text(json.dumps(state, indent=1))
        print(f"dev-cluster: a machine did not start: {exc}", file=sys.stderr)
        down(args)
        return 1
    finally:
        ray.shutdown()
    print(f"dev cluster up: head at {address} (driver only), {args.nodes} sandbox machine(s) of {args.cpus} CPU "
          f"each, their own docker daemons, the run home hidden from them. Try:\n"
          f"  RAY_AUTH_MODE=token rollout run configs/swe_demo.yaml farm.address={address} "
          "'farm.node_resources={sandbox: 1}'\nthen `rollout dev-cluster down`.")
    return 0


def _start_head(address: str, port: int) -> dict:
    """``ray start --head`` (no CPUs: it hosts the driver, not rollouts) at ``address`` (the network's gateway: where
    the machines reach it), in a mount namespace of its own, so ``down`` finds every process it started."""
    from cluster.session.machines import mount_namespace

    ray = str(Path(sys.executable).with_name("ray"))
    log = open(ROOT / "head.log", "w")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    process = subprocess.Popen(["unshare", "-m", "--propagation", "private", ray, "start", "--head", f"--port={port}",
                                f"--node-ip-address={address}", "--num-cpus=0", "--include-dashboard=false", "--block"],
                               stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ours, deadline = mount_namespace("self"), time.monotonic() + 120
    namespace = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the head did not start: {(ROOT / 'head.log').read_text()[-800:]}")
        namespace = namespace or (mount_namespace(process.pid) if mount_namespace(process.pid) != ours else None)
        if namespace and "Ray runtime started" in (ROOT / "head.log").read_text():
            return {"pid": process.pid, "namespace": namespace}
        time.sleep(0.5)
    raise TimeoutError("the head did not start within 120 s")


def status(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no dev cluster is up")
        return 0
    from cluster.session.machines import Machine

    state = json.loads(STATE.read_text())
    print(f"head at {state['address']}")
    for entry in state["machines"]:
        machine = Machine.from_state(entry)
        alive = machine.answers() and bool(machine.pids())
        print(f"{machine.name}: {'alive' if alive else 'gone'} at {machine.address} (docker at {machine.docker_host})")
    return 0


def down(args: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no dev cluster is up")
        return 0
    from cluster.session.machines import Machine, kill_until_gone, namespace_pids
    from cluster.session.netns import Network

    state = json.loads(STATE.read_text())
    for entry in state["machines"]:
        machine = Machine.from_state(entry)
        machine.kill()
        machine.netns.delete()
        shutil.rmtree(machine.root, ignore_errors=True)
    head = state.get("head") or {}
    kill_until_gone(lambda: namespace_pids(head.get("namespace")))
    Network.from_state(state["network"]).delete()
    current = Path("/tmp/ray/ray_current_cluster")  # `ray start` wrote it; a plain ray.init() would join a dead head
    port = state["address"].rsplit(":", 1)[1]
    if current.is_file() and current.read_text().strip().endswith(f":{port}"):
        current.unlink()
    STATE.unlink()
    print(f"dev cluster down: {len(state['machines'])} machine(s) and the head stopped")
    return 0
