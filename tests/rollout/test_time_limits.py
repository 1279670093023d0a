"""The time limit counts the agent's own time: not the environment's reset, not the model's calls. A model
that never answers within its budget is an infrastructure failure, never the time_limit outcome."""

import asyncio

from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
from envs.runtimes.null import NullRuntime
from envs.shell_env import ShellEnvironment
from rollout import runner
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import Task

TASK = Task(task_id="t", prompt="go")
LS = "```bash\nls\n```"
SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


class SlowModel:
    """The scripted model, each call taking ``seconds`` (a loaded server); ``None`` never answers."""

    def __init__(self, outputs, seconds):
        self.inner, self.seconds = ScriptedModel(outputs), seconds

    async def complete(self, messages, tools=None, **kw):
        await asyncio.sleep(1e9 if self.seconds is None else self.seconds)
        return await self.inner.complete(messages, tools, **kw)


class SlowRuntime(NullRuntime):
    """Echoes commands; its start takes ``start`` seconds (an image build), ``ls`` hangs if ``hang_ls``."""

    def __init__(self, start=0.0, hang_ls=False):
        super().__init__({"echo": True})
        self.start_seconds, self.hang_ls = start, hang_ls

    async def start(self):
        await asyncio.sleep(self.start_seconds)
        await super().start()

    async def exec(self, command, timeout=None, cwd=None, env=None):
        if self.hang_ls and command.strip() == "ls":
            await asyncio.sleep(1e9)  # a command that ignores its timeout
        return await super().exec(command, timeout, cwd, env)


def run(model, runtime, time_limit, **limits):
    agent = MiniSweAgent(MiniSweAgentConfig(time_limit=time_limit, **limits))
    return asyncio.run(runner.run_rollout(TASK, agent, model, ShellEnvironment(runtime), limits=agent.limits()))


def test_a_slow_reset_is_not_the_agents_time():
    result = run(ScriptedModel([LS, SUBMIT]), SlowRuntime(start=0.6), time_limit=0.5)
    assert (result.status, result.exit_reason) == ("completed", ExitReason.SUBMITTED)


def test_model_call_time_is_not_the_agents_time():
    # 0.8 s of model time against a 0.5 s limit: the model has its own budget (model_time_limit)
    result = run(SlowModel([LS, LS, LS, SUBMIT], seconds=0.2), SlowRuntime(), time_limit=0.5, model_time_limit=5.0)
    assert (result.status, result.exit_reason) == ("completed", ExitReason.SUBMITTED)
    assert len(result.trajectory.steps) == 4


def test_the_model_budget_defaults_to_the_time_limit_and_passing_it_is_infrastructure():
    result = run(SlowModel([LS, LS, LS, SUBMIT], seconds=0.2), SlowRuntime(), time_limit=0.5)
    assert (result.status, result.exit_reason) == ("infra_failed", ExitReason.MODEL_ERROR)
    assert len(result.trajectory.steps) == 2 and result.reward is None  # the steps it had are kept


def test_a_model_that_never_answers_is_a_model_error_not_a_time_limit():
    result = run(SlowModel([SUBMIT], seconds=None), SlowRuntime(), time_limit=0.3)
    assert (result.status, result.exit_reason) == ("infra_failed", ExitReason.MODEL_ERROR)
    assert result.reward is None and "model_time_limit" in result.error.message


def test_a_hung_command_is_still_cut_at_the_time_limit_after_its_grace(monkeypatch):
    monkeypatch.setattr(runner, "TIME_LIMIT_GRACE", 0.2)
    result = run(ScriptedModel([LS]), SlowRuntime(start=0.6, hang_ls=True), time_limit=0.3)
    assert (result.status, result.exit_reason) == ("completed", ExitReason.TIME_LIMIT)
    assert [s.actions[0].arguments["command"] for s in result.trajectory.steps] == ["ls"]  # the hung step is kept
    # no episode saw this exit (the runner cut the loop): it is recorded all the same, on the step it ended
    assert result.trajectory.exit_reason == result.trajectory.steps[-1].termination_reason == ExitReason.TIME_LIMIT
    assert "time_limit=0.3s" in result.trajectory.exit_message
