"""What a trainer plugs in without glue: the runnable example, scripted policies that see the tasks a call hands
them (scripted server and the Serve scripted app), dataset-shaped rows, trainer samples, sampling per call,
staleness."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import RolloutFarm
from rollout.errors import ConfigError

HERE = {"app": "scripted", "in_process": True}  # a scripted policy played on the farm's own event loop

ROOT = Path(__file__).resolve().parents[3]
SHELL = {"agent": {"type": "mini_swe", "max_steps": 12},
         "environment": {"type": "shell", "command_timeout": 10, "setup_from_task": True},
         "runtime": {"type": "local"}, "verifier": {"type": "check_command"}, "run": {"concurrency": 8}}
TOKENS = {"type": "openai", "model": "scripted", "return_token_ids": True, "logprobs": True}


def demo_shell_rows() -> list[dict]:
    rows = [json.loads(line) for line in (ROOT / "configs" / "data" / "local_demo.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "shell"]


def test_the_example_training_loop_runs():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_loop.py"), "--local", "--steps", "2"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 0", "step 1"]
    assert all("mean reward 0.50" in line for line in steps)
    # the fake template: the 2nd turn's generation prompt (5 ids) is the prompt's, not the model's
    assert "mask 40/67 model tokens" in out.stdout and "version 1" in out.stdout
    assert "padded: prompt_ids (16," in out.stdout


def test_the_demo_policy_plays_the_rows_generate_hands_it():
    rows = demo_shell_rows()
    config = {"model": TOKENS, "serve": {**HERE, "policy": "demo"}, "farm": {"backend": "local"}, **SHELL}
    with RolloutFarm.from_config(config) as farm:
        batch = farm.generate(rows, n=2)  # dataset-shaped rows: kind, solution, check, ... go to task.data
    assert len(batch.groups) == len(rows) >= 3
    assert batch.rewards == [[1.0, 1.0]] * len(rows), batch.describe()


@pytest.mark.ray
def test_the_serve_scripted_app_sees_the_calls_tasks_too(ray_cluster):
    rows = demo_shell_rows()[:2]
    config = {"model": TOKENS, "serve": {"app": "scripted", "policy": "demo", "name": "trainer-tasks"},
              "farm": {"backend": "local"}, **SHELL}
    with RolloutFarm.from_config(config) as farm:
        batch = farm.generate(rows, n=1)
    assert batch.rewards == [[1.0], [1.0]], batch.describe()


def test_rows_are_checked_the_way_a_dataset_file_is():
    config = {"model": {"type": "scripted", "policy": "echo"}, "farm": {"backend": "local"}, **SHELL}
    with RolloutFarm.from_config(config) as farm:
        with pytest.raises(ConfigError, match=r"tasks\[1\]: no task id"):
            farm.generate([{"task_id": "a", "prompt": "x"}, {"prompt": "no id"}])
        with pytest.raises(ValueError, match="sampling: unknown key"):
            farm.generate([{"task_id": "a", "prompt": "x"}], sampling={"temprature": 1.0})


class RecordingModel:
    """The model seam's double: answers with a scripted submission and records the sampling it was called with."""

    def __init__(self):
        self.sampling: list[dict] = []

    async def complete(self, messages, tools=None, *, meta=None, **sampling):
        from rollout.models.scripted import fake_response

        self.sampling.append(sampling)
        message = {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"}
        return fake_response(messages, message, "stop")


def test_sampling_per_call_reaches_the_model_and_training_and_eval_share_a_farm(tmp_path):
    from agents.swe_agent import MiniSweAgent
    from envs.runtimes.local import LocalRuntime, LocalRuntimeConfig
    from envs.shell_env import ShellEnvironment, ShellEnvironmentConfig

    model = RecordingModel()

    def env_factory(task, meta):
        return ShellEnvironment(LocalRuntime(LocalRuntimeConfig(allow_host_exec=True)), ShellEnvironmentConfig())

    with RolloutFarm.from_objects(model, MiniSweAgent(), env_factory, backend="local") as farm:
        batch = farm.generate([{"task_id": "t", "prompt": "submit"}], n=2,
                              sampling={"temperature": 1.0, "max_tokens": 64})
        assert batch.failed == 0, [r.error for r in batch.results]
        train = list(model.sampling)
        farm.generate([{"task_id": "t", "prompt": "submit"}], n=1, sampling={"temperature": 0.0})
    assert [s["temperature"] for s in train] == [1.0, 1.0] and all(s["max_tokens"] == 64 for s in train)
    assert model.sampling[-1]["temperature"] == 0.0 and "max_tokens" not in model.sampling[-1]


@pytest.mark.parametrize("on_stale", ["mask", "rerun"])
def test_a_sample_older_than_max_staleness_is_masked_or_run_again(on_stale):
    config = {"model": TOKENS, "serve": {**HERE, "policy": "seed_writer", "latency": 1.0},
              "farm": {"backend": "local"}, **SHELL}
    rows = [{"task_id": f"t{k}", "prompt": "seed", "check": "true"} for k in range(2)]
    with RolloutFarm.from_config(config) as farm:
        farm.set_policy_version(1)
        future = farm.submit(rows, n=2, max_staleness=0, on_stale=on_stale)
        time.sleep(0.5)  # every first turn is in flight under version 1
        farm.set_policy_version(2)
        batch = future.result(timeout=120)
    if on_stale == "mask":
        assert batch.stale == 4 and batch.rerun == 0 and batch.masks == [[False, False]] * 2
        assert batch.samples() == [] and batch.rewards == [[0.0, 0.0]] * 2
    else:
        assert batch.rerun == 4 and batch.stale == 0 and batch.masks == [[True, True]] * 2
        versions = {v for s in batch.samples() for v in s.policy_versions}
        assert versions == {"2"}
    assert "stale" in batch.describe()
