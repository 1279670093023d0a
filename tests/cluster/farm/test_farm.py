"""The trainer API on the session's Ray cluster: grouped results, seeds, token data, retries inside a group,
worker reuse across calls, pause/resume and policy versions, failures as data."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from cluster import RolloutFarm
from cluster.assembly.backend_choice import rollout_resources
from cluster.compose import Composer
from cluster.config.run_config import RunConfig
from cluster.placement.slots import Node, Resources, describe_nodes, fewer_than_asked
from rollout.config.load import validate

pytestmark = [pytest.mark.ray]

N_TASKS, N = 8, 4


def config(runtime: dict, **farm) -> dict:
    return {
        "run_id": farm.pop("run_id", "trainer"),
        "model": {"type": "scripted", "policy": "seed_writer"},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell", "command_timeout": 30},
        "runtime": runtime,
        "verifier": {"type": "check_command"},
        "farm": {"backend": "ray", **farm},
        "run": {"concurrency": 16, "max_attempts": 2},
    }


def tasks(pause_for: dict[int, float] | None = None) -> list[dict]:
    """Task k pays 1.0 when (seed + k) % 3 == 0, so every group's rewards are known from its seeds."""
    return [{"task_id": f"t{k}", "prompt": "Write your seed to seed.txt.",
             "data": {"check": f"test $(( ($(cat seed.txt) + {k}) % 3 )) -eq 0",
                      "pause": (pause_for or {}).get(k, 0)}} for k in range(N_TASKS)]


def expected_rewards(base_seed: int) -> list[list[float]]:
    return [[1.0 if (base_seed + s + k) % 3 == 0 else 0.0 for s in range(N)] for k in range(N_TASKS)]


def kill_first_container(rollout_id: str, killed: list[str], stop: threading.Event) -> None:
    """The injected fault: remove the first container of ``rollout_id`` while its command runs."""
    while not stop.is_set():
        out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=rollout-farm.rollout={rollout_id}"],
                             capture_output=True, text=True).stdout.split()
        if out:
            subprocess.run(["docker", "rm", "-f", out[0]], capture_output=True)
            killed.append(out[0])
            return
        time.sleep(0.05)


@pytest.mark.docker
@pytest.mark.slow
def test_generate_groups_seeds_tokens_a_retried_container_and_reused_workers(ray_cluster, base_image):
    runtime = {"type": "docker", "image": base_image, "cpus": 0.5, "memory": "256m"}
    farm = RolloutFarm.from_config(config(runtime, run_id="trainer-docker"))
    killed: list[str] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_first_container, args=("t5#2", killed, stop))
    killer.start()
    try:
        batch = farm.generate(tasks(pause_for={5: 3.0}), n=N, seed=0)
        stop.set()
        killer.join()
        workers_first = {w["worker"] for w in farm.workers()}

        assert len(killed) == 1, "the fault was injected once"
        assert batch.rewards == expected_rewards(0)
        assert batch.failed == 0 and batch.dropped == []
        for group in batch.groups:
            assert len(set(group.seeds)) == N and group.seeds == [0, 1, 2, 3]
            assert {r.group_id for r in group.results} == {group.task_id}
            for r in group.results:
                assert r.trajectory.steps and all(s.completion_token_ids and s.prompt_token_ids
                                                  and s.logprobs for s in r.trajectory.steps)
                assert r.node_id and r.worker in workers_first
        hit = batch.groups[5].results[2]
        assert [a.status for a in hit.attempts] == ["infra_failed", "completed"]
        assert hit.attempts[0].exit_reason.is_infrastructure and hit.seed == 2  # same member, same seed

        again = farm.generate(tasks(), n=N)  # the next training step: new seeds, same workers
        assert {w["worker"] for w in farm.workers()} == workers_first
        assert again.groups[0].seeds == [1000, 1001, 1002, 1003]
        assert again.rewards == expected_rewards(1000)
    finally:
        stop.set()
        farm.close()
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=rollout-farm.run=trainer-docker-0"],
                          capture_output=True, text=True).stdout.split()
    assert left == []


def test_pause_holds_model_calls_and_versions_are_stamped_per_turn(ray_cluster):
    farm = RolloutFarm.from_config(config({"type": "null", "echo": True}, run_id="trainer-pause"))
    try:
        farm.set_policy_version("v1")
        farm.pause()
        box: dict = {}
        thread = threading.Thread(target=lambda: box.update(batch=farm.generate(tasks()[:2], n=2)))
        thread.start()
        time.sleep(2.0)
        live = farm.live()
        assert len(live) == 4 and all(r["step"] == 0 for r in live), "no model call may start while paused"
        farm.set_policy_version("v2")
        farm.resume()
        thread.join(60)
        batch = box["batch"]
        steps = [s for r in batch.results for s in r.trajectory.steps]
        assert steps and {s.policy_version for s in steps} == {"v2"}
        assert all(w["policy_version"] == "v2" for w in farm.workers())
    finally:
        farm.close()


def test_a_failing_member_is_data_and_the_group_policy_applies(ray_cluster):
    # A task without a check command is a verifier error: an infrastructure failure that no retry can change
    # (retryable: false), so it runs once, then is data in the batch (never an exception that loses the others).
    broken = {"task_id": "no-check", "prompt": "Write your seed.", "data": {}}
    cfg = config({"type": "null", "echo": True}, run_id="trainer-policy")
    with RolloutFarm.from_config(cfg, group_policy={"on_failure": "drop"}) as farm:
        batch = farm.generate([tasks()[0], broken], n=2)
    assert [g.task_id for g in batch.groups] == ["t0"]
    assert [g.task_id for g in batch.dropped] == ["no-check"]
    assert batch.failed == 2 and batch.failures == {"verifier_error": 2}
    assert all(len(r.attempts) == 1 for r in batch.dropped[0].results)  # not retried: it cannot change
    with RolloutFarm.from_config(cfg, group_policy={"on_failure": "mask"}, backend="local") as farm:
        masked = farm.generate([broken], n=2)
    assert masked.masks == [[False, False]] and masked.rewards == [[0.0, 0.0]]


def test_from_objects_on_ray_and_results_streamed_as_they_finish(ray_cluster):
    import asyncio

    from agents.swe_agent import MiniSweAgent
    from envs.runtimes.null import NullRuntime, NullRuntimeConfig
    from envs.shell_env import ShellEnvironment
    from envs.verifiers import CheckCommandVerifier
    from rollout.models.policies import seed_writer
    from rollout.models.scripted import ScriptedModel

    farm = RolloutFarm.from_objects(
        ScriptedModel(policy=seed_writer), MiniSweAgent(),
        env_factory=lambda task, meta: ShellEnvironment(NullRuntime(NullRuntimeConfig(echo=True))),
        verifier_factory=lambda task, env: CheckCommandVerifier(env=env),
        name="trainer-objects", concurrency=4,
    )

    async def consume():
        seen = []
        async for result in farm.stream(tasks()[:3], n=2, seed=7):
            seen.append((result.task_id, result.sample_index, result.seed, result.status))
        return seen

    try:
        seen = asyncio.run(consume())
        assert sorted(seen) == [(f"t{k}", s, 7 + s, "completed") for k in range(3) for s in range(2)]
        assert len(farm.workers()) == 1 and farm.workers()[0]["finished"] == 6
    finally:
        farm.close()


def test_a_token_budget_stops_new_rollouts_and_says_which_never_started(ray_cluster):
    cfg = config({"type": "null", "echo": True}, run_id="trainer-budget")
    cfg["run"]["concurrency"] = 2
    with RolloutFarm.from_config(cfg, backend="local", token_budget=1) as farm:
        batch = farm.generate(tasks()[:3], n=2)
        # at most the window (2) started before the first result spent the budget; the rest never started
        assert 1 <= len(batch.results) <= 2 and len(batch.results) + len(batch.not_started) == 6
        assert f"{len(batch.not_started)} not started (token budget)" in batch.describe()
        assert farm.tokens_used == batch.tokens > 1


def test_a_node_split_among_workers_uses_every_worker(ray_cluster):
    """``workers_per_node: 2``: two worker processes share the node's slots, and rollouts run on both."""
    runtime = {"type": "null", "echo": True, "delay": 0.2}
    with RolloutFarm.from_config(config(runtime, run_id="two-workers", workers_per_node=2)) as farm:
        workers = farm.workers()
        batch = farm.generate(tasks(), n=2)
    assert len({w["pid"] for w in workers}) == 2
    assert batch.failed == 0 and len(batch.results) == 2 * N_TASKS
    assert len({r.worker for r in batch.results}) == 2, "both workers ran rollouts"


def test_slots_split_among_workers_by_default_only_past_a_thousand():

    assert Resources().workers({"CPU": 2}, 256) == [256]
    assert Resources().workers({"CPU": 2}, 10_000) == [5000, 5000]
    assert Resources().workers({"CPU": 8}, 2_500) == [1250, 1250]
    assert Resources(workers_per_node=3).workers({"CPU": 1}, 10) == [4, 3, 3]
    assert Resources(workers_per_node=4).workers({"CPU": 4}, 2) == [1, 1], "never a worker without a slot"


def reserved(runtime: dict, **farm) -> Resources:
    raw = {"model": {"type": "scripted", "outputs": ["hi"]}, "agent": {"type": "mini_swe"},
           "environment": {"type": "shell"}, "runtime": runtime, "dataset": {"path": "-"}, "farm": farm}
    run_config = validate(RunConfig, raw)
    return rollout_resources(run_config, Composer(run_config))


def test_a_sandbox_reserves_what_it_uses_not_its_containers_limits():
    """The SWE demo's container (``cpus: 1``, ``memory: 1g``) on a node of 2 CPUs and 16 GiB: 64 rollouts at once
    from the farm's default reservation, not 2 from the container's CPU limit; a container capped below the default
    reserves its own cap; the farm's keys win; a runtime without containers reserves nothing countable."""
    node = {"CPU": 2.0, "memory": 16 * 2**30}
    demo = reserved({"type": "docker", "cpus": 1.0, "memory": "1g"})
    assert (demo.capacity(node, 64), demo.binding(node, 64)) == (64, "run.concurrency=64")
    assert demo.limits(node) == {"farm.cpus_per_rollout=0.03125 (its default) on 2 CPUs": 64,
                                 "farm.memory_per_rollout=128m (its default) of 16.0 GiB": 128}
    tiny = reserved({"type": "docker", "cpus": 0.01, "memory": "64m"})
    assert (tiny.cpus, tiny.memory_bytes) == (0.01, 64 * 2**20)
    assert (tiny.capacity(node, 1000), tiny.binding(node, 1000)) == (200, "runtime.cpus=0.01 on 2 CPUs")
    asked = reserved({"type": "docker", "cpus": 1.0}, cpus_per_rollout=0.5, memory_per_rollout="256m")
    assert (asked.capacity(node, 64), asked.binding(node, 64)) == (4, "farm.cpus_per_rollout=0.5 on 2 CPUs")
    assert reserved({"type": "local", "allow_host_exec": True}).limits(node) == {}


def test_fewer_rollouts_at_once_than_asked_is_said_once_naming_what_binds():
    """A node of 2 CPUs whose rollouts reserve ``runtime.cpus: 1`` takes 2 rollouts at once, not the 64 asked: the
    farm says so in words, with the key that binds and the keys that would change it; as many as asked: nothing."""
    node = {"CPU": 2.0, "memory": 16 * 2**30}
    taken = reserved({"type": "docker", "cpus": 1.0, "memory": "1g"}, cpus_per_rollout=1.0)
    assert (taken.capacity(node, 64), taken.binding(node, 64)) == (2, "farm.cpus_per_rollout=1 on 2 CPUs")
    nodes = [Node("560d6590aa", taken.capacity(node, 64), actor=object(), bound_by=taken.binding(node, 64),
                  allows=taken.allowances(node))]
    assert describe_nodes(nodes) == ("1 node: node 560d6590 runs up to 2 rollouts at once "
                                     "(farm.cpus_per_rollout=1 on 2 CPUs)")
    line = fewer_than_asked(nodes, 64)
    assert line.startswith("farm: 2 rollout(s) at once, not the 64 run.concurrency asks: "
                           "bound by farm.cpus_per_rollout=1 on 2 CPUs (per node, farm.cpus_per_rollout=1 on 2 "
                           "CPUs: 2, farm.memory_per_rollout=128m (its default) of 16.0 GiB: 128). ")
    assert "farm.cpus_per_rollout" in line and "farm.memory_per_rollout" in line
    default = reserved({"type": "docker", "cpus": 1.0, "memory": "1g"})
    nodes = [Node("560d6590aa", default.capacity(node, 64), actor=object(), bound_by=default.binding(node, 64))]
    assert nodes[0].capacity == 64 and nodes[0].bound_by == "run.concurrency=64"
    assert fewer_than_asked(nodes, 64) is None


def test_a_stream_leaves_the_farms_group_policy_to_a_generate_beside_it():
    """A stream yields every member (its own policy masks) while a generate on the same farm, at the same time,
    still drops a failed group as the farm's policy says."""
    import asyncio

    broken = {"task_id": "no-check", "prompt": "Write your seed.", "data": {}}
    cfg = config({"type": "local"}, run_id="trainer-stream-policy")  # a shell that really sleeps
    with RolloutFarm.from_config(cfg, group_policy={"on_failure": "drop"}, backend="local") as farm:
        async def both():
            async def consume():
                return [r.task_id async for r in farm.stream([tasks({0: 2.0})[0], broken], n=1)]
            streaming = asyncio.create_task(consume())
            await asyncio.sleep(0.5)  # the stream's slow member is running
            batch = await asyncio.wrap_future(farm.submit([broken, tasks()[1]], n=1))
            return await streaming, batch

        streamed, batch = asyncio.run(both())
    assert sorted(streamed) == ["no-check", "t0"]  # the stream's failed member is yielded too
    assert [g.task_id for g in batch.dropped] == ["no-check"] and [g.task_id for g in batch.groups] == ["t1"]
