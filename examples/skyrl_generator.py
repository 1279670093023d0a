"""SkyRL's generator interface (skyrl 0.3.0, ``skyrl.train.generators.base.GeneratorInterface``) backed by a
``RolloutFarm``: SkyRL's trainer hands it its input batch and gets its ``GeneratorOutput`` back, every rollout run by
the farm (its agents, environments, sandboxes and verifiers; retries, group policy, staleness).

    pip install 'skyrl[fsdp]==0.3.0'      # SkyRL's own environment (Python >= 3.12), then, from this checkout:
    pip install -e '.[ray]'
    python -m examples.skyrl_generator     # the RL example's tool tasks, one SkyRL batch, checked by SkyRL

SkyRL 0.3.0 imports on Python 3.12 and later (on 3.11, pydantic refuses its tinker types' ``typing.TypedDict``); the
tests run it in a venv beside ours instead (``tests/foreign_venvs.py``, ``SKYRL``). Its trainer needs CUDA (its FSDP
model wrapper imports flash-attn, its workers call ``torch.cuda``, its placement groups ask for GPUs): on a CPU the
interface is what runs.

The mapping is plain code in the farm's package (``cluster.farm.skyrl_batch``); this class only speaks SkyRL's types:
``TrajectoryID``s in and out, SkyRL's ``get_rollout_metrics`` beside the farm's own counts. Construct it with a farm
and hand it to SkyRL's trainer as its generator (SkyRL's entry point builds its generator in ``get_generator``:
override that in your ``BasePPOExp`` subclass).

Run as a script, it builds a farm on the tool tasks (the scripted ``tool_solver`` policy, played in this process, token
ids and logprobs on), makes SkyRL's input with SkyRL's own ``prepare_generator_input`` (4 prompts x 4 samples), calls
``generate``, runs SkyRL's ``validate_generator_output`` and prints what came back.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput
from skyrl.train.generators.utils import get_rollout_metrics, prepare_generator_input
from skyrl.train.utils.trainer_utils import validate_generator_output

from cluster import RolloutFarm
from cluster.farm.skyrl_batch import generator_output, plan_batch, results_by_member
from examples.rl_cpu.tasks import make_tasks
from examples.tool_solver import TOOL_TASKS


class RolloutFarmGenerator(GeneratorInterface):
    """``generate(input_batch)``: the batch's rows as farm members (a ``TrajectoryID``'s instance is the task and
    group, its repetition the sample), run by ``farm``; the ``GeneratorOutput`` in input order. ``deadline``: seconds
    for each call (what has not finished comes back masked). ``last_results``: the farm's result behind each row."""

    def __init__(self, farm: RolloutFarm, *, pad_id: int = 0, deadline: float | None = None):
        self.farm, self.pad_id, self.deadline = farm, pad_id, deadline
        self.last_results: list[Any] = []

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        trajectory_ids = input_batch.get("trajectory_ids")
        plan = plan_batch(input_batch["prompts"], input_batch["env_classes"], input_batch.get("env_extras"),
                          input_batch.get("sampling_params"),
                          [(t.instance_id, t.repetition_id) for t in trajectory_ids] if trajectory_ids else None,
                          profiles=self.farm.profiles())
        self.farm.start()  # joins Ray in the caller's thread on the first call, as Ray wants
        batches = await asyncio.gather(*(
            asyncio.wrap_future(self.farm.submit(call.tasks, call.n, sampling=plan.sampling, seed=plan.seed,
                                                 deadline=self.deadline)) for call in plan.calls))
        results = results_by_member(batches)
        self.last_results = [results.get(key) for key in plan.rows]
        output = generator_output(plan, results, self.pad_id)
        output["trajectory_ids"] = trajectory_ids
        # SkyRL's token statistics (not its per-environment ones: those look the env class up in skyrl_gym's registry)
        output["rollout_metrics"] = {
            **get_rollout_metrics(output["response_ids"], output["rewards"], None, None, output["loss_masks"],
                                  output["trajectory_generation_times"]),
            **output["rollout_metrics"]}
        return output


def main() -> int:
    rows = make_tasks(4, seed=0, split="train")
    prompts = [{"prompt": [{"role": "user", "content": r["prompt"]}], "env_class": "tool_tasks",
                "env_extras": {"data": r["data"]}, "uid": r["task_id"]} for r in rows]
    sampling = {"max_generate_length": 64, "temperature": 1.0, "top_p": 1.0, "logprobs": 0}
    batch, uids = prepare_generator_input(prompts, 4, sampling, "tool_tasks", "train", 0)
    with RolloutFarm.from_config(TOOL_TASKS) as farm:
        output = asyncio.run(RolloutFarmGenerator(farm).generate(batch))
    validate_generator_output(len(batch["prompts"]), output)
    for uid, tid, reward, mask, stop in zip(uids, output["trajectory_ids"], output["rewards"], output["loss_masks"],
                                            output["stop_reasons"]):
        print(f"{tid.to_string():<40} reward {reward:.1f}  model tokens {sum(mask):>3}/{len(mask):<3} {stop}")
    print(f"SkyRL's validate_generator_output accepted {len(output['response_ids'])} rows; "
          f"mean reward {sum(output['rewards']) / len(output['rewards']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
