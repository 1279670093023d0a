"""2,000 scripted rollouts at once in one process (asyncio, null runtime) all finish."""

import asyncio
import time

from agents.demo.tools import demo_tools
from agents.swe_agent import MiniSweAgent
from agents.tool_agent import ToolCallingAgent
from envs.runtimes.null import NullRuntime, NullRuntimeConfig
from envs.shell_env import ShellEnvironment
from envs.tool_env import ToolEnvironment
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

N = 2000
SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash_then_submit(messages, ctx):
    turn = sum(m["role"] == "assistant" for m in messages)
    cmd = f"echo {SENTINEL}" if turn == 2 else f"echo step {turn}"
    return f"step {turn}\n```bash\n{cmd}\n```"


async def many_swe():
    model = ScriptedModel(policy=bash_then_submit)
    agent = MiniSweAgent()

    async def one(i):
        task = Task(task_id=f"t{i}", prompt="go")
        env = ShellEnvironment(NullRuntime(NullRuntimeConfig(echo=True, delay=0.01)))
        return await run_rollout(task, agent, model, env, meta=RequestMeta(rollout_id=f"r{i}", task_id=task.task_id))

    return await asyncio.gather(*(one(i) for i in range(N)))


def test_2000_concurrent_mini_swe_rollouts_all_finish():
    t0 = time.perf_counter()
    results = asyncio.run(many_swe())
    elapsed = time.perf_counter() - t0
    print(f"\n{N} concurrent Mini-SWE rollouts x 3 steps (null runtime, 10 ms/command): {elapsed:.2f} s")
    assert len(results) == N
    assert {r.exit_reason for r in results} == {ExitReason.SUBMITTED}
    assert all(len(r.trajectory.steps) == 3 for r in results)
    assert len({r.rollout_id for r in results}) == N


def test_2000_concurrent_tool_rollouts_all_finish():
    script = [{"tool_calls": [{"name": "calculate", "arguments": {"expression": "6*7"}}]}, "42"]
    model = ScriptedModel(script)

    async def main():
        agent = ToolCallingAgent()
        return await asyncio.gather(*(
            run_rollout(Task(task_id=f"t{i}", prompt="6*7?"), agent, model, ToolEnvironment(demo_tools()),
                        meta=RequestMeta(rollout_id=f"r{i}", task_id=f"t{i}"))
            for i in range(N)
        ))

    t0 = time.perf_counter()
    results = asyncio.run(main())
    print(f"\n{N} concurrent tool-calling rollouts x 2 steps: {time.perf_counter() - t0:.2f} s")
    assert [r.submission for r in results] == ["42"] * N
