"""Harbor tasks through the trainer API (``configs/harbor_train.yaml``): the config's dataset read by the farm,
``generate`` in groups with per-sample seeds, rewards from each task's own tests, token ids and logprobs on every
model turn, a multi-step task's per-step rewards and its token stream split at the step; ``stream`` and
``stream_groups`` handing out the same groups; the model played in each worker, reading the archive that travelled
with the task; a policy that does nothing getting 0 from the same tests."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from cluster import RolloutFarm
from envs.harbor.dataset import load_harbor_tasks
from rollout.config.load import load_yaml
from rollout.errors import ConfigError

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "harbor_train.yaml"
IDS = ["fix-fizzbuzz", "hello-file", "two-steps"]  # the dataset's order: by directory name
N, SEED = 2, 7


@pytest.fixture(scope="module")
def farm(ray_cluster, base_image):
    farm = RolloutFarm.from_config(CONFIG, ["run_id=harbor-trainer", f"dataset.ids=[{', '.join(IDS)}]"])
    try:
        yield farm.start()
    finally:
        farm.close()
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=rollout-farm.run=harbor-trainer-0"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], "the farm's containers are gone once it closes"


@pytest.fixture(scope="module")
def batch(farm):
    return farm.generate(farm.dataset(), n=N, seed=SEED)


def outcome(result) -> tuple:
    """What a trainer reads of a member besides its tokens."""
    return result.task_id, result.sample_index, result.seed, result.status, result.reward


def test_the_dataset_section_is_read_beside_the_config_as_rollout_run_reads_it(tmp_path):
    farm = RolloutFarm.from_config(CONFIG, [f"dataset.ids=[{', '.join(IDS)}]"])  # nothing starts
    tasks = farm.dataset()
    assert [t.task_id for t in tasks] == IDS
    assert tasks == load_harbor_tasks(ROOT / "configs" / "harbor" / "tasks", ids=IDS)  # the same as by hand
    assert tasks[2].data["harbor"]["steps"] == ["create", "extend"]
    task = tmp_path / "online"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM rollout-farm/base:bookworm\n")
    (task / "task.toml").write_text('[environment]\nnetwork_mode = "public"\n')
    (task / "instruction.md").write_text("Fetch something.\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    with pytest.raises(ConfigError, match="network_mode 'public'"):  # checked against the environment section
        RolloutFarm.from_config(CONFIG, [f"dataset.path={tmp_path}"]).dataset()
    with pytest.raises(ConfigError, match="no dataset section"):
        RolloutFarm.from_config({k: v for k, v in load_yaml(CONFIG).items() if k != "dataset"}).dataset()


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.slow
def test_generate_groups_harbor_tasks_with_seeds_rewards_and_token_data(batch):
    assert batch.failed == 0 and batch.dropped == [], batch.describe()
    assert [g.task_id for g in batch.groups] == IDS
    for group in batch.groups:
        assert group.seeds == [SEED + s for s in range(N)]  # one seed per member, sent to the model
        assert {r.group_id for r in group.results} == {group.task_id}
    assert batch.rewards == [[1.0] * N] * len(IDS)  # the task's own tests pay the solution
    for r in batch.results:
        assert r.exit_reason.value == "submitted" and r.reward_details["reward_key"] == "reward"
        assert r.reward_details["rewards"]["reward"] == 1.0 and r.reward_details["reward_file"] == "reward.txt"
        steps = r.trajectory.steps
        assert steps, r.rollout_id
        for step in steps:  # every model turn: the prompt's ids, the completion's ids and one logprob per id
            assert step.prompt_token_ids and step.completion_token_ids, (r.rollout_id, step)
            assert len(step.logprobs) == len(step.completion_token_ids)
    fizz = batch.groups[0].results[0]
    assert "fizzbuzz.py" in fizz.trajectory.steps[0].actions[0].arguments["command"]  # solved through a model turn


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.slow
def test_a_multi_step_task_reports_each_steps_reward_and_splits_its_tokens_at_the_step(batch):
    two = batch.groups[IDS.index("two-steps")]
    for r in two.results:
        details = r.reward_details
        assert [(s["step"], s["rewards"]) for s in details["steps"]] == [("create", {"reward": 1.0}),
                                                                      ("extend", {"reward": 1.0})]
        assert (details["steps_run"], details["steps_total"], details["strategy"]) == (2, 2, "mean")
        assert len(r.trajectory.steps) == 4  # each step: the solution, then the submission
        assert [b["turn"] for b in r.metadata["token_breaks"]] == [3]  # the second step's fresh conversation
    for group in batch.groups[:2]:
        assert all(r.metadata["token_breaks"] == [] for r in group.results)  # one token stream per rollout
    samples = batch.samples()
    per_rollout = {}
    for s in samples:
        per_rollout.setdefault((s.task_id, s.sample_index), []).append(s.segment)
    assert per_rollout == {(t, i): ([0, 1] if t == "two-steps" else [0]) for t in IDS for i in range(N)}
    for s in samples:
        assert len(s.response_ids) == len(s.loss_mask) == len(s.logprobs) and 0 < sum(s.loss_mask)
        assert s.reward == 1.0 and s.advantage == 0.0  # a group that all passed teaches nothing


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.slow
def test_stream_and_stream_groups_hand_out_the_same_groups(farm, batch):
    tasks = farm.dataset()

    async def consume():
        return [r async for r in farm.stream(tasks, n=N, seed=SEED)]

    streamed = asyncio.run(consume())
    assert sorted(map(outcome, streamed)) == sorted(map(outcome, batch.results))  # the same seed, the same members
    tokens = {(r.task_id, r.sample_index): [s.completion_token_ids for s in r.trajectory.steps] for r in batch.results}
    assert {(r.task_id, r.sample_index): [s.completion_token_ids for s in r.trajectory.steps]
            for r in streamed} == tokens

    with farm.stream_groups(tasks, n=N, batch_groups=len(IDS), max_staleness=None) as stream:
        grouped = stream.next_batch(timeout=240)
    assert sorted(g.task_id for g in grouped.groups) == IDS and grouped.failed == 0, grouped.describe()
    for group in grouped.groups:
        assert len(group.results) == N and group.rewards == [1.0] * N
        assert len(set(group.seeds)) == N and not set(group.seeds) & {SEED + s for s in range(N)}  # a new call's
    assert len(grouped.samples()) == len(batch.samples())


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.slow
def test_a_model_played_on_the_workers_reads_the_archive_that_travelled_with_the_task(ray_cluster, base_image):
    # the scripted model in each worker process: the task it sees names its archive by content (carried), not by a
    # path of the machine that loaded the dataset
    overrides = ["run_id=harbor-trainer-worker", "serve=null", "model={type: scripted, policy: harbor_solver}",
                 "dataset.ids=[hello-file, two-steps]"]
    with RolloutFarm.from_config(CONFIG, overrides) as farm:
        batch = farm.generate(farm.dataset(), n=N, seed=SEED)
    assert batch.failed == 0 and batch.rewards == [[1.0] * N] * 2, batch.describe()
    assert all(s.completion_token_ids and s.logprobs for r in batch.results for s in r.trajectory.steps)


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.slow
def test_a_policy_that_does_nothing_gets_nothing_from_the_same_tests(base_image):
    tasks = load_harbor_tasks(ROOT / "configs" / "harbor" / "tasks", ids=["hello-file", "two-steps"])
    overrides = ["run_id=harbor-trainer-empty", "serve.policy=empty", "farm.backend=local"]
    with RolloutFarm.from_config(CONFIG, overrides) as farm:
        batch = farm.generate(tasks, n=N, seed=SEED)
    assert batch.failed == 0, batch.describe()
    assert batch.rewards == [[0.0] * N] * 2
    two = batch.groups[1]
    for r in two.results:  # the first step's tests paid 0, under its min_reward: the second never ran
        assert r.reward_details["steps_run"] == 1 and "gated" in r.reward_details["steps"][0]
    assert all(s.completion_token_ids and s.logprobs for r in batch.results for s in r.trajectory.steps)
