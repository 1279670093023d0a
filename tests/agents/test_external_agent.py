"""Where the ExternalAgent runs its command: in the runtime an environment declares (``HasRuntime``) with the
environment's variables under the agent's own, or, without one, as a bash action through the environment's step.
The gateway is real; the commands here call no model."""

from __future__ import annotations

import asyncio

import pytest

from agents.external_agent import ExternalAgent
from cluster.gym.gateway import gateway_app
from envs.resources.serving import serve_in_thread
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from rollout.models.scripted import ScriptedModel
from rollout.protocols import EnvReset, HasRuntime
from rollout.records import Observation, RequestMeta, Task
from rollout.runner import run_rollout

COMMAND = 'printf "%s %s %s" "$PAGER" "$SHARED" "$ROLLOUT_ID"'


class StepOnlyEnvironment:
    """An environment with no runtime of its own: it answers bash actions through ``step``."""

    def __init__(self):
        self.actions = []

    async def reset(self, task):
        return EnvReset()

    async def step(self, actions):
        self.actions += actions
        return [Observation(content="ran through step", info={"returncode": 0}) for _ in actions]

    async def close(self):
        pass


@pytest.fixture(scope="module")
def gateway():
    with serve_in_thread(gateway_app("http://127.0.0.1:9")) as server:  # no model is called
        yield server


def run(gateway, environment, **config):
    agent = ExternalAgent({"command": COMMAND, "gateway_url": gateway.url, "submission": "output", "timeout": 60,
                           **config})
    task = Task(task_id="t", prompt="say the variables")
    meta = RequestMeta(rollout_id="t#0", task_id="t")
    return asyncio.run(run_rollout(task, agent, ScriptedModel([]), environment, meta=meta))


def test_the_command_runs_in_the_declared_runtime_with_the_environments_variables_under_the_agents(gateway,
                                                                                                   tmp_path):
    env = ShellEnvironment(LocalRuntime({"allow_host_exec": True, "root": str(tmp_path)}),
                           {"env": {"PAGER": "cat", "SHARED": "environment's"}})
    assert isinstance(env, HasRuntime)
    result = run(gateway, env, env={"SHARED": "agent's"})
    assert result.status == "completed" and result.exit_reason.value == "natural_completion", result.error
    assert result.submission == "cat agent's t#0"


def test_without_a_declared_runtime_the_command_is_a_bash_action_through_step(gateway):
    env = StepOnlyEnvironment()
    assert not isinstance(env, HasRuntime)
    result = run(gateway, env)
    assert result.status == "completed" and result.submission == "ran through step", result.error
    [action] = env.actions
    assert action.kind == "bash" and action.arguments["command"].endswith(COMMAND)
    assert "ROLLOUT_ID=t#0" in action.arguments["command"].replace("'", "")
