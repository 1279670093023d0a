"""A model replica killed while rollouts' calls are in flight on it, with docker sandboxes: how its death can reach a
sandbox. Serve answers the in-flight calls HTTP 500 at once; the model client retries 5xx and the sticky router
sends the retry to a live replica, so the sandbox is untouched. Only a call whose retries are exhausted (here
``max_retries: 0``) ends its attempt as ``model_error``, and ending an attempt closes its environment, which
removes its container (no reaper, switch or session release is involved); the farm runs the attempt again in a
new container, which resolves."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow]


def containers(run_id: str) -> set[str]:
    shown = subprocess.run(["docker", "ps", "-a", "--filter", f"label=rollout-farm.run={run_id}-0",
                            "--format", "{{.Names}}"], capture_output=True, text=True)
    return set(shown.stdout.split())


def run_through_a_replica_kill(ray, base_image: str, run_id: str, max_retries: int) -> tuple[list, set[str], set]:
    """(the results, every container the run had, the first ones) of 4 rollouts whose first model call (2 s)
    is in flight when the busier of the two replicas is killed."""
    from cluster.farm.rollout_farm import RolloutFarm
    from rollout.records import Task

    config = {
        "run_id": run_id,
        "serve": {"app": "scripted", "name": run_id, "route_prefix": f"/{run_id}", "policy": "seed_writer",
                  "replicas": 2, "latency": 2.0},
        "model": {"type": "openai", "model": "scripted-seed", "max_retries": max_retries},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell", "command_timeout": 60},
        "runtime": {"type": "docker", "image": base_image, "cpus": 0.25, "memory": "256m"},
        "verifier": {"type": "check_command"},
        "farm": {"backend": "ray"},
        "run": {"max_attempts": 2},
    }
    tasks = [Task(task_id=f"t{k}", prompt="Write your seed.", data={"check": "test -s seed.txt"}) for k in range(4)]
    with RolloutFarm.from_config(config, concurrency=8) as farm:
        future = farm.submit(tasks, 1)
        deadline = time.monotonic() + 120
        while len(containers(run_id)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        first = containers(run_id)
        replicas = [ray.get_actor(a["name"], namespace=a["namespace"])
                    for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith(f"SERVE_REPLICA::{run_id}#")]
        busy: list = []
        while sum(n for n, _ in busy) < 4 and time.monotonic() < deadline:  # every rollout in its first call
            busy = [(ray.get(r.get_num_ongoing_requests.remote()), i) for i, r in enumerate(replicas)]  # (Serve's)
            time.sleep(0.05)
        calls, victim = max(busy)
        assert calls > 0, "model calls are in flight on the replica to kill"
        ray.kill(replicas[victim], no_restart=True)
        seen = set(first)
        while not future.done():
            seen |= containers(run_id)
            time.sleep(0.1)
        batch = future.result()
    return [r for g in [*batch.groups, *batch.dropped] for r in g.results], seen, first


def test_a_model_replica_killed_mid_call_reaches_a_sandbox_only_through_its_attempts_model_error(ray_cluster,
                                                                                             base_image):
    results, seen, first = run_through_a_replica_kill(ray_cluster, base_image, "replica-kill", max_retries=5)
    assert len(first) == 4 and all(r.status == "completed" and r.reward == 1.0 for r in results)
    assert [len(r.attempts) for r in results] == [1, 1, 1, 1], "the retried calls rode through the replica's death"
    assert seen == first, "no sandbox was replaced"

    results, seen, first = run_through_a_replica_kill(ray_cluster, base_image, "replica-kill-no-retry", max_retries=0)
    assert all(r.status == "completed" and r.reward == 1.0 for r in results)
    failed = [a for r in results for a in r.attempts if a.status != "completed"]
    assert failed and {a.exit_reason.value for a in failed} == {"model_error"}, failed
    assert all("HTTP 500" in (a.error.message if a.error else "") for a in failed)
    assert len(seen - first) == len(failed), "each failed attempt's rerun had a new container; no other was touched"
    assert containers("replica-kill-no-retry") == set()
