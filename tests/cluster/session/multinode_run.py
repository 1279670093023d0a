"""A run on a two-node Ray cluster whose worker node crashes half way; prints a JSON report as its last line.

Run as a subprocess by ``test_multinode.py``, so the ``ray.cluster_utils.Cluster`` it starts, the driver's Ray
connection and the node it kills never touch the test process::

    python multinode_run.py CONFIG --ray-tmpdir DIR --kill-after N [key=value ...]

Every Ray process of the cluster keeps its files under ``DIR`` (so they can be found by it) and ports are
Ray's free picks, so a Ray session already running on the machine is neither joined nor disturbed. Both
nodes are raylets on this machine whose rollouts share one docker daemon; the ``rollout-farm.node`` label
tells their containers apart. A sampler thread counts the run's live containers per node every
``SAMPLE_INTERVAL`` seconds, and a killer thread removes the worker node without a graceful shutdown (a
crash) once ``--kill-after`` results are written and the sampler sees that node's rollouts in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

SAMPLE_INTERVAL = 0.2
"""Seconds between two looks at the run's live containers."""
NODE_CPUS = 2
HEALTH_CHECK = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 4,
}
"""GCS health checks of the raylets: a node that stops answering is dead after ~4 s (Ray's default: ~15 s)."""
RUN_LABEL = "rollout-farm.run"
NODE_LABEL = "rollout-farm.node"


class Clock:
    """Seconds since the script started, for the timeline in the report."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return round(time.monotonic() - self.t0, 2)


class Progress:
    """The job's progress stream: copied to stderr, with the first time each farm event was printed."""

    EVENTS = {"worker_died": " died (", "node_left": "left the cluster", "reaped": "container(s) of dead workers"}

    def __init__(self, clock: Clock, inner: TextIO = sys.stderr):
        self.clock, self.inner = clock, inner
        self.seen: dict[str, float] = {}

    def write(self, text: str) -> int:
        for name, marker in self.EVENTS.items():
            if marker in text and name not in self.seen:
                self.seen[name] = self.clock()
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()


def run_containers(run_id: str, *, all_states: bool = False) -> list[str]:
    """The node label of each of the run's containers (running ones only unless ``all_states``)."""
    argv = ["docker", "ps", "--filter", f"label={RUN_LABEL}={run_id}", "--format", f'{{{{.Label "{NODE_LABEL}"}}}}']
    if all_states:
        argv.insert(2, "-a")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"docker ps failed: {out.stderr.strip()}")
    return out.stdout.splitlines()


def results(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Sampler(threading.Thread):
    """Counts the run's live containers per node until stopped: the most seen at once, and when last seen."""

    def __init__(self, run_id: str, clock: Clock):
        super().__init__(daemon=True)
        self.run_id, self.clock = run_id, clock
        self.max_per_node: Counter = Counter()
        self.last_seen: dict[str, float] = {}
        self.latest: Counter = Counter()
        self.samples = 0
        self.error: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                now = Counter(run_containers(self.run_id))
            except Exception as exc:  # noqa: BLE001 - reported: a blind sampler must fail the test
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.latest, at = now, self.clock()
            self.samples += 1
            for node, count in now.items():
                self.max_per_node[node] = max(self.max_per_node[node], count)
                self.last_seen[node] = at
            self.stop.wait(SAMPLE_INTERVAL)


class Killer(threading.Thread):
    """Removes ``node`` from ``cluster`` without a graceful shutdown once ``after`` results are written and
    the sampler sees containers of that node; then waits for the cluster to report the node dead."""

    def __init__(self, cluster: Any, node: Any, run_dir: Path, sampler: Sampler, after: int, clock: Clock):
        super().__init__(daemon=True)
        self.cluster, self.node, self.run_dir, self.sampler = cluster, node, run_dir, sampler
        self.after, self.clock = after, clock
        self.killed_at: float | None = None
        self.reported_dead_at: float | None = None
        self.in_flight_on_node = 0
        self.error: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        import ray

        try:
            while not self.stop.wait(0.1):
                on_node = self.sampler.latest.get(self.node.node_id, 0)
                if on_node >= 1 and len(results(self.run_dir)) >= self.after:
                    self.in_flight_on_node = on_node
                    self.killed_at = self.clock()
                    self.cluster.remove_node(self.node, allow_graceful=False)
                    break
            while not self.stop.wait(0.2) and self.killed_at is not None:
                if not any(n["NodeID"] == self.node.node_id and n.get("Alive") for n in ray.nodes()):
                    self.reported_dead_at = self.clock()
                    return
        except Exception as exc:  # noqa: BLE001 - reported, and the test fails on it
            self.error = f"{type(exc).__name__}: {exc}"


def outcome(run_dir: Path, head: str, worker: str) -> dict[str, Any]:
    """What the run wrote, in the terms the test asserts on."""
    lines = results(run_dir)
    final: dict[tuple[str, int], dict[str, Any]] = {}
    for line in lines:
        key = (line["task_id"], line["sample_index"])
        if key not in final or line["attempt"] >= final[key]["attempt"]:
            final[key] = line
    return {
        "head_node": head,
        "worker_node": worker,
        "lines": len(lines),
        "final": {f"{t}#{s}": r["status"] for (t, s), r in final.items()},
        "completed_per_node": dict(Counter(r["node_id"] for r in lines if r["status"] == "completed")),
        "retried": {
            f"{r['task_id']}#{r['sample_index']}": [
                {"status": a["status"], "exit_reason": a["exit_reason"], "node_id": a["node_id"]}
                for a in r["attempts"]]
            for r in final.values() if len(r.get("attempts") or []) > 1
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--ray-tmpdir", required=True, help="directory for every file of the cluster's processes")
    parser.add_argument("--kill-after", type=int, required=True, help="results written before the node is killed")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_intermixed_args(argv)
    os.environ["RAY_TMPDIR"] = args.ray_tmpdir  # before Ray is imported: its session and address files go there

    import ray
    from ray.cluster_utils import Cluster

    from cluster.run import job as jobs

    clock = Clock()
    progress = Progress(clock)
    report: dict[str, Any] = {}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS, "include_dashboard": False, "_system_config": HEALTH_CHECK})
    threads: list[Sampler | Killer] = []
    try:
        worker = cluster.add_node(num_cpus=NODE_CPUS)
        ray.init(address=cluster.address)
        head = ray.get_runtime_context().get_node_id()
        report["cluster_up_at"] = clock()
        job = jobs.prepare([args.config], [f"farm.address={cluster.address}", *args.overrides], out=progress)
        report["planned"] = len(job.plan.todo)
        sampler = Sampler(job.run_id, clock)
        killer = Killer(cluster, worker, job.run_dir, sampler, args.kill_after, clock)
        threads = [sampler, killer]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        asyncio.run(jobs.execute(job))
        report["run_seconds"] = round(time.monotonic() - started, 2)
        sampler.stop.set()
        sampler.join()
        killer.join(timeout=60)  # until the cluster reports the killed node dead (~4 s after the kill)
        report.update(outcome(job.run_dir, head, worker.node_id))
        report.update(
            max_live_per_node=dict(sampler.max_per_node), samples=sampler.samples, sampler_error=sampler.error,
            killed_at=killer.killed_at, in_flight_on_killed_node=killer.in_flight_on_node,
            reported_dead_at=killer.reported_dead_at, kill_error=killer.error,
            killed_node_containers_last_seen_at=sampler.last_seen.get(worker.node_id),
            farm_events_at=progress.seen, leftover_containers=len(run_containers(job.run_id, all_states=True)))
    finally:
        for thread in threads:
            thread.stop.set()
            thread.join(timeout=60)  # the killer may be inside remove_node: never race shutdown()
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
