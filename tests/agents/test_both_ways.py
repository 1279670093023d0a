"""Every loop agent two ways on the same scripted model: the loop driving generation (``run_rollout``), and a
caller driving it turn by turn (``agent.session``: reset, step, should_continue), as a trainer that owns
generation does. Both go through one turn function, so the trajectories are the same."""

import asyncio
import json
import re

import pytest

from agents.demo.tools import demo_tools
from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from agents.text_agent import TextActionAgent, TextActionAgentConfig
from agents.tool_agent import ToolCallingAgent, ToolCallingAgentConfig
from envs.games import GuessNumber
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from envs.step_env import StepEnvironmentAdapter
from envs.tool_env import ToolEnvironment
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash(command):
    return f"Running it.\n```bash\n{command}\n```"


def call(name, **arguments):
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


CASES = {
    "mini_swe submits": (
        lambda: MiniSweAgent(MiniSweAgentConfig(max_steps=6)),
        lambda: ShellEnvironment(LocalRuntime({}, trusted_model=True)),
        [bash("echo hello > hello.txt"), "no block here", bash("wc -c hello.txt"),
         bash(f"echo {SENTINEL} && cat hello.txt")],
    ),
    "mini_swe runs out of steps": (
        lambda: MiniSweAgent(MiniSweAgentConfig(max_steps=2)),
        lambda: ShellEnvironment(LocalRuntime({}, trusted_model=True)),
        [bash("echo one"), bash("echo two"), bash("echo three")],
    ),
    "tool_calling completes": (
        lambda: ToolCallingAgent(ToolCallingAgentConfig(max_steps=5)),
        lambda: ToolEnvironment(demo_tools()),
        [call("calculate", expression="17*23"), call("no_such_tool"), call("calculate", expression="391+4"),
         "It is 395."],
    ),
    "text_action answers": (
        lambda: TextActionAgent(TextActionAgentConfig(parser="json", max_steps=5)),
        lambda: ToolEnvironment(demo_tools()),
        ['{"tool": "calculate", "parameters": {"expression": "6*7"}}', "garbage", "Final Answer: 42"],
    ),
    "text_action game ends": (
        lambda: TextActionAgent(TextActionAgentConfig(parser="react", max_steps=5)),
        lambda: StepEnvironmentAdapter(GuessNumber),
        ["Action: guess\nAction Input: 3", "Action: guess\nAction Input: 7"],
    ),
}


def task_for(name):
    data = {"target": 7, "high": 10} if "game" in name else {}
    return Task(task_id="both", prompt="Do the task.", data=data)


def shape(trajectory):
    """What a user of the trajectory sees, without timings; the workspace's random name and the scripted model's
    call-id counter (artefacts of running twice) masked."""
    steps = [(s.message, [a.model_dump() for a in s.actions], [o.content for o in s.observations], s.format_error,
              s.termination_reason, s.completion_token_ids) for s in trajectory.steps]
    text = json.dumps([trajectory.messages, steps, trajectory.exit_reason, trajectory.submission,
                       trajectory.env_reward, trajectory.tools], default=str)
    return re.sub(r"call_\d+", "call_N", re.sub(r"rollout-ws-\w+", "rollout-ws-X", text))


async def by_the_loop(name):
    make_agent, make_env, outputs = CASES[name]
    agent, task = make_agent(), task_for(name)
    result = await run_rollout(task, agent, ScriptedModel(outputs), make_env(), limits=agent.limits(),
                               meta=RequestMeta(rollout_id="r", task_id=task.task_id))
    return result.trajectory


async def by_a_caller(name):
    make_agent, make_env, outputs = CASES[name]
    agent, task, env = make_agent(), task_for(name), make_env()
    model = ScriptedModel(outputs)  # the trainer's generator: the same outputs, from the same conversation
    session = agent.session(env)
    try:
        await session.reset(task)
        tools = session.tools if agent.offers_tools else None
        while session.should_continue():
            await session.step(await model.complete(session.ctx.messages, tools))
    finally:
        await env.close()
    return session.ctx.trajectory


@pytest.mark.parametrize("name", list(CASES))
def test_the_loop_and_a_caller_produce_the_same_trajectory(name):
    looped = asyncio.run(by_the_loop(name))
    stepped = asyncio.run(by_a_caller(name))
    assert looped.exit_reason is not None and looped.steps
    assert shape(stepped) == shape(looped)
