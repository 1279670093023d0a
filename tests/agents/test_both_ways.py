"""Every loop agent two ways on the same scripted model: the loop driving generation (``run_rollout``), and a
caller driving it turn by turn (``agent.session``: reset, should_continue, request, step), as a trainer that owns
generation does. Both go through the same limits, prompt and turn function, so the model is asked the same and the
trajectories are the same, down to how each ended."""

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
from rollout.errors import ExitReason
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


def masked(value):
    """``value`` as JSON, the workspace's random name and the scripted model's call-id counter (artefacts of running
    twice) masked."""
    text = json.dumps(value, default=str)
    return re.sub(r"call_\d+", "call_N", re.sub(r"rollout-ws-\w+", "rollout-ws-X", text))


def shape(trajectory):
    """What a user of the trajectory sees, without timings."""
    steps = [(s.message, [a.model_dump() for a in s.actions], [o.content for o in s.observations], s.format_error,
              s.termination_reason, s.completion_token_ids) for s in trajectory.steps]
    return masked([trajectory.messages, steps, trajectory.exit_reason, trajectory.exit_message, trajectory.submission,
                   trajectory.env_reward, trajectory.tools])


class Recording(ScriptedModel):
    """The scripted model, keeping what each call was asked: the prompt and the tools."""

    def __init__(self, outputs):
        super().__init__(outputs)
        self.asked = []

    async def complete(self, messages, tools=None, **kw):
        self.asked.append(([dict(m) for m in messages], tools))
        return await super().complete(messages, tools, **kw)


async def by_the_loop(name):
    make_agent, make_env, outputs = CASES[name]
    agent, task, model = make_agent(), task_for(name), Recording(outputs)
    result = await run_rollout(task, agent, model, make_env(), limits=agent.limits(),
                               meta=RequestMeta(rollout_id="r", task_id=task.task_id))
    return result.trajectory, model.asked


async def by_a_caller(name):
    make_agent, make_env, outputs = CASES[name]
    agent, task, env = make_agent(), task_for(name), make_env()
    model = Recording(outputs)  # the trainer's generator: the same outputs, from what the episode asks
    session = agent.session(env)
    try:
        await session.reset(task)
        while session.should_continue():
            request = session.request()
            await session.step(await model.complete(request.messages, request.tools))
    finally:
        await env.close()
    return session.ctx.trajectory, model.asked


@pytest.mark.parametrize("name", list(CASES))
def test_the_loop_and_a_caller_produce_the_same_trajectory(name):
    looped, loop_asked = asyncio.run(by_the_loop(name))
    stepped, caller_asked = asyncio.run(by_a_caller(name))
    assert looped.exit_reason is not None and looped.exit_message and looped.steps
    assert shape(stepped) == shape(looped)
    assert masked(caller_asked) == masked(loop_asked)  # request() hands the caller what the loop sends the model
    assert all((tools is not None) == ("tool_calling" in name) for _, tools in caller_asked)


def test_a_caller_is_stopped_before_generating_once_the_time_limit_has_passed():
    """``should_continue`` asks the rollout's limits (the agent's time included), not only the step count."""
    agent = TextActionAgent(TextActionAgentConfig(parser="json", time_limit=0.05))

    async def drive():
        session = agent.session(ToolEnvironment(demo_tools()))
        await session.reset(Task(task_id="t", prompt="What is 6*7?"))
        await asyncio.sleep(0.1)  # the caller takes its time (generating elsewhere)
        return session, session.should_continue()

    session, going = asyncio.run(drive())
    trajectory = session.ctx.trajectory
    assert not going and session.done and not session.should_continue()
    assert trajectory.exit_reason == ExitReason.TIME_LIMIT and "time_limit=0.05s" in trajectory.exit_message
    assert trajectory.steps == []
