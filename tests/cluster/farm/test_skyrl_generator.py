"""SkyRL's generator interface backed by the farm (``examples/skyrl_generator.py`` over ``cluster.farm.skyrl_batch``):
SkyRL's own input batch (``prepare_generator_input``) in, its ``GeneratorOutput`` out, accepted by its own
``validate_generator_output``, on two workloads: the RL example's tool tasks (the scripted solver; token ids and
logprobs from the scripted server, as an engine sends them) and the SWE demo (the gold policy, local runtime). The
mapping's own cases (sampling, groups, prompts, stop reasons, rows without tokens) run in our venv.

The farm runs inside SkyRL 0.3.0's venv, which sees our packages after its own (``foreign_venvs.SKYRL``), on the local
backend (no Ray): SkyRL's function makes the batch, SkyRL's ``GeneratorInterface`` subclass takes it and SkyRL's
validation checks what it returns, in one process with SkyRL's own objects (``TrajectoryID``s in and out). Only the
verdict and the data our assertions compare cross back as JSON."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # examples/ is not an installed package: plain `pytest` does not put the root on the path
    sys.path.insert(0, str(ROOT))

from foreign_venvs import run_function

from cluster import RolloutFarm
from cluster.farm.skyrl_batch import GENERATOR_OUTPUT_KEYS, generator_output, plan_batch, results_by_member
from envs.swe.mini import build
from examples.rl_cpu.tasks import make_tasks
from examples.tool_solver import TOOL_TASKS
from rollout.models import scripted_tokens

N = 4
SWE_NAMES = ["bytesize", "csvstats"]


def skyrl_generate(request: dict) -> dict:
    """In SkyRL's venv: its input batch for each workload, our ``GeneratorInterface`` on a farm, its validation."""
    import asyncio
    import typing

    from skyrl.train.generators.base import GeneratorInterface, GeneratorOutput, TrajectoryID
    from skyrl.train.generators.utils import prepare_generator_input
    from skyrl.train.utils.trainer_utils import validate_generator_output

    from cluster import RolloutFarm
    from examples.rl_cpu.tasks import make_tasks
    from examples.skyrl_generator import RolloutFarmGenerator
    from examples.tool_solver import TOOL_TASKS

    def run(farm, prompts, n, sampling, env_class):
        batch, uids = prepare_generator_input(prompts, n, sampling, env_class, "train", 0)
        generator = RolloutFarmGenerator(farm)
        assert isinstance(generator, GeneratorInterface)
        output = asyncio.run(generator.generate(batch))
        validate_generator_output(len(batch["prompts"]), output)  # raises on what SkyRL's trainer would refuse
        assert output["trajectory_ids"] is batch["trajectory_ids"]
        assert all(isinstance(t, TrajectoryID) for t in output["trajectory_ids"])
        rows = []
        for result in generator.last_results:
            steps = result.trajectory.steps
            rows.append({"task_id": result.task_id, "sample": result.sample_index, "reward": result.reward,
                         "exit_reason": result.exit_reason.value, "first_prompt": steps[0].prompt_token_ids,
                         "completions": [s.completion_token_ids for s in steps],
                         "logprobs": [s.logprobs for s in steps], "replies": [s.message for s in steps]})
        return {"output": {**output, "trajectory_ids": [[t.instance_id, t.repetition_id]
                                                        for t in output["trajectory_ids"]]},
                "uids": uids, "farm": rows, "keys": sorted(typing.get_type_hints(GeneratorOutput))}

    rows = make_tasks(4, seed=0, split="train")
    tools = [{"prompt": [{"role": "user", "content": r["prompt"]}], "env_class": "tool_tasks",
              "env_extras": {"data": r["data"]}, "uid": r["task_id"]} for r in rows]
    sampling = {"max_generate_length": 64, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "logprobs": 0, "stop": None, "min_tokens": 1, "skip_special_tokens": True,
                "include_stop_str_in_output": True}
    with RolloutFarm.from_config(TOOL_TASKS) as farm:
        answer = {"tools": run(farm, tools, request["n"], sampling, "tool_tasks")}
    with RolloutFarm.from_config(request["swe_config"], request["swe_overrides"]) as farm:
        swe = [{"prompt": [{"role": "user", "content": t.prompt}], "env_class": "swe", "env_extras": {"data": t.data},
                "uid": t.task_id} for t in farm.dataset()]
        answer["swe"] = run(farm, swe, 1, {"max_generate_length": 4096, "temperature": 0.0}, "swe")
    return answer


@pytest.fixture(scope="module")
def skyrl(skyrl_python, tmp_path_factory):
    data = build(tmp_path_factory.mktemp("swe"), names=SWE_NAMES)  # two of the demo's instances, not all twelve
    request = {"n": N, "swe_config": str(ROOT / "configs" / "swe_demo.yaml"),
               "swe_overrides": [f"dataset.path={data}", "dataset.generate=null", "serve=null",
                                 "serve={app: scripted, in_process: true, policy: gold}", "runtime={type: local}",
                                 "farm.backend=local", "model.return_token_ids=true", "model.logprobs=true"]}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}, "PYTHONPATH": str(ROOT)}
    return run_function(skyrl_python, skyrl_generate, request, cwd=ROOT, env=env, timeout=600)


def engine_reply(message: dict) -> tuple[list[int], list[float]]:
    """What the scripted server sent for one assistant message: its ids and logprobs (its own, not the farm's)."""
    text = scripted_tokens.render_reply(message)
    return scripted_tokens.token_ids(text), scripted_tokens.logprobs(text)


@pytest.mark.slow
def test_skyrl_takes_the_farms_output_for_its_own_input_batch(skyrl):
    for workload in ("tools", "swe"):
        out = skyrl[workload]["output"]
        assert skyrl[workload]["keys"] == sorted(GENERATOR_OUTPUT_KEYS)  # every field the pinned version declares
        assert set(out) == set(GENERATOR_OUTPUT_KEYS)
        for response, mask, logprobs in zip(out["response_ids"], out["loss_masks"], out["rollout_logprobs"]):
            assert len(mask) == len(response) == len(logprobs) > 0
    tools = skyrl["tools"]
    assert tools["output"]["trajectory_ids"] == [[uid, k % N] for k, uid in enumerate(tools["uids"])]  # input order
    assert [(r["task_id"], r["sample"]) for r in tools["farm"]] == [tuple(t) for t in tools["output"]["trajectory_ids"]]


@pytest.mark.slow
def test_token_ids_and_logprobs_are_the_engines_and_rewards_the_farms(skyrl):
    tools = skyrl["tools"]
    out = tools["output"]
    for i, farm in enumerate(tools["farm"]):
        response, mask, logprobs = out["response_ids"][i], out["loss_masks"][i], out["rollout_logprobs"][i]
        assert out["prompt_token_ids"][i] == farm["first_prompt"]
        sent = [engine_reply(m) for m in farm["replies"]]
        assert [ids for ids, _ in sent] == farm["completions"]
        assert [t for t, m in zip(response, mask) if m] == [t for ids, _ in sent for t in ids]
        assert [x for x, m in zip(logprobs, mask) if m] == [x for _, lps in sent for x in lps]
        assert all(x == 0.0 for x, m in zip(logprobs, mask) if not m)
        assert out["rewards"][i] == farm["reward"]
    # the solver plays even seeds, guesses on odd ones: every group of 4 is right, wrong, right, wrong
    assert out["rewards"] == [1.0, 0.0] * (len(out["rewards"]) // 2)
    assert len({len(farm["replies"]) for farm in tools["farm"]}) > 1  # one to three turns
    assert out["stop_reasons"] == ["stop"] * len(out["rewards"])  # every last turn was ended by the engine


@pytest.mark.slow
def test_the_gold_policy_resolves_the_swe_demo_through_skyrl(skyrl):
    swe = skyrl["swe"]
    assert swe["output"]["rewards"] == [1.0, 1.0]
    assert [r["exit_reason"] for r in swe["farm"]] == ["submitted", "submitted"]
    assert swe["output"]["stop_reasons"] == ["stop", "stop"]
    assert swe["output"]["rollout_metrics"]["farm/exit_reason/submitted"] == 2
    for i, farm in enumerate(swe["farm"]):
        assert [t for t, m in zip(swe["output"]["response_ids"][i], swe["output"]["loss_masks"][i]) if m] == \
            [t for ids in farm["completions"] for t in ids]


# ---- the mapping, in our venv -----------------------------------------------------------------------------------


def test_a_skyrl_batch_becomes_groups_of_the_farm_with_its_sampling():
    rows = [{"role": "user", "content": "What is 2 + 2?"}]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    plan = plan_batch([rows, rows, chat], ["tool_tasks", "tool_tasks", "mini"],
                      [{"data": {"answer": 4}}, {"data": {"answer": 4}}, {"check": "true"}],
                      {"max_generate_length": 32, "temperature": 0.5, "logprobs": 0, "skip_special_tokens": True,
                       "stop": ("\n",), "top_k": None, "seed": 7},
                      [("a", 0), ("a", 1), ("b", 0)], profiles=[None, "mini"])
    assert [(c.n, [t.task_id for t in c.tasks]) for c in plan.calls] == [(2, ["a"]), (1, ["b"])]
    a, b = plan.calls[0].tasks[0], plan.calls[1].tasks[0]
    assert a.prompt == "What is 2 + 2?" and a.data == {"answer": 4} and a.metadata["skyrl_env_class"] == "tool_tasks"
    assert b.messages == chat and b.data == {"check": "true", "profile": "mini"}  # an env class naming a profile
    assert plan.sampling == {"max_tokens": 32, "temperature": 0.5, "stop": ["\n"]} and plan.seed == 7
    assert plan.set_aside == ["logprobs", "skip_special_tokens"]
    assert plan.rows == [("a", 0), ("a", 1), ("b", 0)]
    with pytest.raises(ValueError, match="'temprature' is not a sampling parameter"):
        plan_batch([rows], ["x"], None, {"temprature": 1.0}, None)
    with pytest.raises(ValueError, match=r"repetitions \[0, 2\]"):
        plan_batch([rows, rows], ["x", "x"], None, None, [("a", 0), ("a", 2)])


def test_stop_reasons_say_how_a_row_ended_and_a_row_without_tokens_is_masked():
    rows = make_tasks(2, seed=1, split="train")
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    plan = plan_batch(prompts, ["tool_tasks"] * 2, [{"data": r["data"]} for r in rows], {"max_generate_length": 3},
                      [(r["task_id"], 0) for r in rows])
    refuse = {"match": rows[1]["task_id"], "fail_first_n": 10, "status": 400}  # the engine refuses the 2nd task
    config = {**TOOL_TASKS, "serve": {**TOOL_TASKS["serve"], "faults": refuse}}
    with RolloutFarm.from_config(config, max_attempts=1) as farm:
        batch = farm.generate(plan.calls[0].tasks, plan.calls[0].n, sampling=plan.sampling, seed=0)
        cut = farm.generate(plan.calls[0].tasks, plan.calls[0].n, deadline=0.0)  # nothing starts in no time
    out = generator_output(plan, results_by_member([batch]), pad_id=5)
    assert out["stop_reasons"] == ["length", "model_error"]  # cut at 3 tokens by the engine; failed in the farm
    assert len(out["response_ids"][0]) == 3 and out["loss_masks"][0] == [1, 1, 1]
    assert out["prompt_token_ids"][1] == [5] and out["response_ids"][1] == [5] and out["loss_masks"][1] == [0]
    assert out["rewards"] == [r.reward or 0.0 for r in batch.results] == [0.0, 0.0]
    assert out["rollout_metrics"]["farm/failed"] == 1 and out["rollout_metrics"]["farm/trained"] == 1
    out = generator_output(plan, results_by_member([cut]))
    assert out["stop_reasons"] == ["not_started"] * 2 and out["loss_masks"] == [[0]] * 2
    assert out["rollout_metrics"]["farm/not_started"] == 2
