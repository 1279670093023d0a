"""A command that floods its output (``yes``): cut at the runtime's cap, stopped, and said so; stored elided."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid

import pytest

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TASK = Task(task_id="flood", prompt="Print a lot.")
STORED_BOUND = 20_000
"""Characters a flooded command may leave in the trajectory's observation (the cap is 1,000,000)."""

RUNTIMES = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def make_runtime(kind, request):
    if kind == "local":
        return LocalRuntime({"allow_host_exec": True})
    from envs.runtimes.docker.runtime import DockerRuntime

    image = request.getfixturevalue("base_image")
    return DockerRuntime({"image": image}, run_id=f"test-{uuid.uuid4().hex[:8]}", rollout_id="flood")


def bash(cmd):
    return f"Running it.\n```bash\n{cmd}\n```"


def rollout(runtime, commands):
    agent = MiniSweAgent(MiniSweAgentConfig())
    model = ScriptedModel([bash(c) for c in commands] + [bash(f"echo {SENTINEL}")])
    return asyncio.run(run_rollout(TASK, agent, model, ShellEnvironment(runtime), limits=agent.limits(),
                                   meta=RequestMeta(rollout_id="r", task_id=TASK.task_id)))


@pytest.mark.parametrize("kind", RUNTIMES)
def test_yes_is_reported_as_cut_and_stopped_and_stored_elided(kind, request):
    result = rollout(make_runtime(kind, request), ["yes", "echo hi"])
    assert result.exit_reason == ExitReason.SUBMITTED, result.error
    flood, normal = (s.observations[0] for s in result.trajectory.steps[:2])
    seen_flood, seen_normal = [m["content"] for m in result.trajectory.messages if m["role"] == "user"][1:3]

    # The runtime's result as the environment got it: cut, and stopped by us (SIGKILL), on every runtime.
    assert flood.info["truncated"] is True and flood.info["timed_out"] is False
    assert flood.info["returncode"] == -signal.SIGKILL, flood.info
    # What the model reads says the output was cut at the cap and the command stopped.
    assert "<returncode>-9</returncode>" in seen_flood
    assert "truncated" in seen_flood and "stopped" in seen_flood and "1,000,000 bytes" in seen_flood
    # What is stored is the elided form, bounded, with the head and the tail of the output.
    assert len(flood.content) < STORED_BOUND, len(flood.content)
    assert flood.content.startswith("y\ny\n") and "characters elided" in flood.content
    stored = json.dumps([result.trajectory.messages, [o.model_dump(mode="json") for o in (flood, normal)]])
    assert len(stored) < 3 * STORED_BOUND, len(stored)  # JSON escapes each "\n": 3 characters for every "y\n"

    # A normal command is unchanged.
    assert normal.content == "hi\n" and normal.info["truncated"] is False and normal.info["returncode"] == 0
    assert seen_normal == "<returncode>0</returncode>\n<output>\nhi\n\n</output>"  # as before


@pytest.mark.parametrize("kind", RUNTIMES)
def test_an_output_under_the_cap_is_kept_whole(kind, request):
    result = rollout(make_runtime(kind, request), ["seq 1 20000"])
    [obs] = result.trajectory.steps[0].observations
    assert obs.info["truncated"] is False and obs.info["returncode"] == 0
    assert obs.content == "".join(f"{i}\n" for i in range(1, 20001))  # 108,894 characters, not elided
