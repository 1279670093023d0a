"""The farm across machines on this one: images per node with and without locality, registry vs the object store,
and rollouts/s on 1, 2 and 3 nodes.

    python tests/perf/bench_nodes.py [--instances 20] [--samples 4] [--concurrency 12]

Each scenario starts fresh machines (``cluster.session.machines``, what ``rollout dev-cluster`` starts: a Ray node with
its own network address, its own docker daemon and an empty image store, the head's files masked, one CPU each)
beside a head in this process, and runs the SWE demo's
config on them from a driver on the head (``rollout run configs/swe_demo.yaml farm.node_resources={sandbox: 1}``)
over ``--instances`` instances (the 12 of the bundled mini benchmark, then copies under new ids: each its own
instance image) x ``--samples``:

- registry, locality on / off: every image pulled from a registry at the machines' network gateway (``rollout
  images build --registry`` pushed them first, untimed); pulls per node vs the distinct images the node ran (target
  with locality: <= 1.2x them, and <= 0.5x the pulls without locality);
- object store: no registry; the base image loaded from the driver machine's daemon through Ray, each instance
  image built on its node from the carried repository;
- 1, 2 and 3 nodes, registry and locality: rollouts/s.

Each side's work is checked (every rollout completed and resolved) before its numbers are printed; a side that did
not do the work prints why instead of a ratio. The host has 2 cores: three one-CPU nodes oversubscribe it, so
rollouts/s flattens past two nodes here; what scales is what a node does not share (its daemon, its disk).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from cluster.session.machines import Machine, Registry  # noqa: E402
from cluster.session.netns import Network  # noqa: E402


def dataset(where: Path, instances: int) -> Path:
    """The mini benchmark's rows, then copies under new instance ids (another image each) up to ``instances``."""
    subprocess.run([sys.executable, "-m", "envs.swe.mini", str(where)], check=True, cwd=PROJECT, capture_output=True)
    rows = [json.loads(line) for line in (where / "swe_mini.jsonl").read_text().splitlines() if line.strip()]
    out, copy = [], 0
    while len(out) < instances:
        for row in rows:
            if len(out) == instances:
                break
            if copy:
                row = {**row, "instance_id": f"{row['instance_id']}-copy{copy}"}
            out.append(row)
        copy += 1
    path = where / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def run(address: str, data: Path, out_dir: Path, *extra: str) -> tuple[dict, list[dict], float, str]:
    command = [sys.executable, "-m", "cluster", "run", str(PROJECT / "configs" / "swe_demo.yaml"),
               f"farm.address={address}", "farm.node_resources={sandbox: 1}", f"dataset.path={data}",
               "dataset.generate=null", f"output.dir={out_dir}", "run.progress_interval=30", *extra]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT)}
    env.pop("RAY_ADDRESS", None)
    began = time.monotonic()
    done = subprocess.run(command, cwd=out_dir.parent, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - began
    log = done.stdout + done.stderr
    if done.returncode != 0:
        return {}, [], wall, f"exit {done.returncode}: {log[-800:]}"
    summary = json.loads((out_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines() if line.strip()]
    return summary, rows, wall, ""


def scenario(name: str, head: str, root: Path, network: Network, nodes: int, data: Path, *extra: str) -> dict:
    machines = []
    try:
        for index in range(1, nodes + 1):
            tag = f"bench_{uuid.uuid4().hex[:6]}"
            machines.append(Machine(tag, index, head, Path("/tmp") / f"rollout-farm-{tag}", num_cpus=1,
                                    resources={"sandbox": 1.0}, masked=[str(root)], network=network,
                                    insecure_registries=[f"{network.gateway}/24"]).start())
        out_dir = root / name.replace(" ", "_")
        summary, rows, wall, problem = run(head, data, out_dir, *extra)
    finally:
        for machine in machines:
            machine.stop()
    final = [r for r in rows if r["status"] == "completed"]
    expected = summary.get("rollouts", {}).get("total", 0)
    if not problem and (len(final) != expected or any(r["reward"] != 1.0 for r in final)):
        problem = f"{len(final)} of {expected} rollouts completed and resolved"
    ran: dict[str, set] = collections.defaultdict(set)
    for r in final:
        ran[r["node_id"]].add(r["task_id"])
    by_node = (summary.get("transfers") or {}).get("by_node", {})
    fetched = {node: info["images"] for node, info in by_node.items()}
    return {"name": name, "nodes": nodes, "problem": problem, "wall": wall, "rollouts": len(final),
            "rate": len(final) / wall if wall else 0.0, "first_call": (summary.get("startup") or {}).get("seconds"),
            "fetched": fetched, "distinct": {n: len(t) for n, t in ran.items()},
            "mb": (summary.get("transfers") or {}).get("total", {}).get("bytes", 0) / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=12, help="the driver's window (waiting rollouts let "
                        "locality choose)")
    args = parser.parse_args(argv)
    import ray

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still stops its machines

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a cluster found here
    head = ray.get_runtime_context().gcs_address
    root = Path(tempfile.mkdtemp(prefix="bench-nodes-"))
    (root / "registry").mkdir()
    network = Network.for_process().create()  # each machine at an address of its own, the registry at the gateway
    registry = Registry(root / "registry", network.gateway).start()
    try:
        data = dataset(root / "data", args.instances)
        prefix = f"{registry.address}/bench"
        subprocess.run([sys.executable, "-m", "cluster", "images", "build", str(data), "--registry", prefix],
                       check=True, cwd=PROJECT, capture_output=True, timeout=3600)
        common = [f"run.samples={args.samples}", f"run.concurrency={args.concurrency}"]
        with_registry = [*common, f"images.registry={prefix}", "images.through_ray=false"]
        results = [
            scenario("registry, locality", head, root, network, 3, data, *with_registry),
            scenario("registry, no locality", head, root, network, 3, data, *with_registry, "images.locality=false"),
            scenario("object store, locality", head, root, network, 3, data, *common),
            scenario("registry, 1 node", head, root, network, 1, data, *with_registry),
            scenario("registry, 2 nodes", head, root, network, 2, data, *with_registry),
        ]
    finally:
        registry.stop()
        ray.shutdown()
        network.delete()
    report(results, args)
    return 0


def report(results: list[dict], args: argparse.Namespace) -> None:
    print(f"\n{args.instances} instances x {args.samples} samples, one-CPU nodes, driver window {args.concurrency}")
    print(f"{'scenario':<24} {'nodes':>5} {'wall s':>7} {'roll/s':>7} {'1st call s':>10} {'MB moved':>9}  "
          "images fetched / distinct images run, per node")
    for r in results:
        if r["problem"]:
            print(f"{r['name']:<24} {r['nodes']:>5}  did not do the work: {r['problem']}")
            continue
        per_node = ", ".join(f"{r['fetched'].get(n, 0)}/{d}" for n, d in sorted(r["distinct"].items()))
        print(f"{r['name']:<24} {r['nodes']:>5} {r['wall']:>7.1f} {r['rate']:>7.2f} {r['first_call'] or 0:>10.1f} "
              f"{r['mb']:>9.0f}  {per_node}")
    by = {r["name"]: r for r in results if not r["problem"]}
    on, off = by.get("registry, locality"), by.get("registry, no locality")
    if on and off:
        pulls_on, pulls_off = sum(on["fetched"].values()), sum(off["fetched"].values())
        distinct = sum(on["distinct"].values())
        print(f"pulls with locality: {pulls_on} = {pulls_on / distinct:.2f}x the distinct images the nodes ran "
              f"(target <= 1.2x; the base image counts once per node) and {pulls_on / pulls_off:.2f}x the "
              f"{pulls_off} pulls without it (target <= 0.5x)")
    store = by.get("object store, locality")
    if on and store and on["first_call"] and store["first_call"]:
        print(f"first model call on fresh nodes: registry {on['first_call']:.1f}s, object store "
              f"{store['first_call']:.1f}s ({store['first_call'] / on['first_call']:.2f}x)")
    one = by.get("registry, 1 node")
    if one:
        for r in (by.get("registry, 2 nodes"), on):
            if r:
                print(f"rollouts/s on {r['nodes']} nodes: {r['rate'] / one['rate']:.2f}x one node's (2 host cores)")


if __name__ == "__main__":
    sys.exit(main())
