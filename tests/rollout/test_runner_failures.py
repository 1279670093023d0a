"""Infrastructure failures are labelled, never scored; a task outcome is final. One place decides."""

import asyncio

import pytest

from agents.demo.tools import demo_tools
from agents.swe_agent import MiniSweAgent
from agents.tool_agent import ToolCallingAgent
from envs.runtimes.null import NullRuntime
from envs.shell_env import ShellEnvironment
from envs.step_env import StepEnvironmentAdapter
from envs.tool_env import ToolEnvironment
from rollout.errors import ContainerStartError, ExitReason, RuntimeFailure, WorkerDied
from rollout.models.scripted import ScriptedModel
from rollout.records import Reward, Task
from rollout.runner import run_rollout

TASK = Task(task_id="t", prompt="go")


class FailingRuntime(NullRuntime):
    """A null runtime with a fault injected at start or on exec."""

    def __init__(self, start_error=None, exec_error=None):
        super().__init__()
        self.start_error, self.exec_error = start_error, exec_error

    async def start(self):
        if self.start_error:
            raise self.start_error
        await super().start()

    async def exec(self, command, timeout=None, cwd=None, env=None):
        if self.exec_error:
            raise self.exec_error
        return await super().exec(command, timeout, cwd, env)


class BrokenGame:
    def __init__(self, task):
        pass

    def reset(self):
        return "start"

    def step(self, action):
        raise RuntimeError("simulator crashed")


def swe(runtime):
    return asyncio.run(run_rollout(TASK, MiniSweAgent(), ScriptedModel(["```bash\nls\n```"]),
                                   ShellEnvironment(runtime)))


@pytest.mark.parametrize(
    "error,reason",
    [
        (ContainerStartError("image missing"), ExitReason.CONTAINER_START_FAILED),
        (WorkerDied("node lost"), ExitReason.WORKER_DIED),
    ],
)
def test_runtime_start_failures_are_infrastructure(error, reason):
    result = swe(FailingRuntime(start_error=error))
    assert result.status == "infra_failed" and result.exit_reason == reason
    assert result.reward is None
    assert result.error.type == type(error).__name__ and result.error.infrastructure


def test_runtime_dying_mid_rollout_is_infrastructure():
    result = swe(FailingRuntime(exec_error=RuntimeFailure("container vanished")))
    assert result.exit_reason == ExitReason.RUNTIME_ERROR and result.reward is None
    assert len(result.trajectory.steps) == 1  # what happened so far is kept


def test_model_error_is_infrastructure():
    result = asyncio.run(run_rollout(TASK, ToolCallingAgent(), ScriptedModel([]), ToolEnvironment(demo_tools())))
    assert result.status == "infra_failed" and result.exit_reason == ExitReason.MODEL_ERROR


def test_environment_error_is_infrastructure():
    from agents.text_agent import TextActionAgent, TextActionAgentConfig

    agent = TextActionAgent(TextActionAgentConfig(parser="react"))
    model = ScriptedModel(["Action: guess\nAction Input: 3"])
    result = asyncio.run(run_rollout(TASK, agent, model, StepEnvironmentAdapter(BrokenGame)))
    assert result.exit_reason == ExitReason.ENVIRONMENT_ERROR
    assert "simulator crashed" in result.error.message


def test_verifier_crash_is_infrastructure_not_zero():
    class CrashingVerifier:
        async def verify(self, task, result):
            raise KeyError("expected")

    result = asyncio.run(run_rollout(TASK, ToolCallingAgent(), ScriptedModel(["fine"]), ToolEnvironment(demo_tools()),
                                     verifier=CrashingVerifier()))
    assert result.status == "infra_failed" and result.exit_reason == ExitReason.VERIFIER_ERROR
    assert result.reward is None
    assert result.error.type == "VerifierError(KeyError)"


def test_untyped_bug_is_labelled_internal_error():
    def exploding_factory(task):
        raise ZeroDivisionError("bug in user code")

    result = asyncio.run(run_rollout(TASK, ToolCallingAgent(), ScriptedModel(["x"]),
                                     ToolEnvironment(exploding_factory)))
    assert result.exit_reason == ExitReason.INTERNAL_ERROR and result.status == "infra_failed"
    assert "ZeroDivisionError" in result.error.traceback


def test_verifier_reward_and_details_are_recorded():
    class Half:
        async def verify(self, task, result):
            return Reward(value=0.5, details={"why": "half right"})

    result = asyncio.run(run_rollout(TASK, ToolCallingAgent(), ScriptedModel(["fine"]), ToolEnvironment(demo_tools()),
                                     verifier=Half()))
    assert (result.reward, result.reward_details) == (0.5, {"why": "half right"})
    assert set(result.timings) >= {"agent", "verify", "total"}


def test_observer_sees_the_lifecycle_and_a_failing_observer_changes_nothing():
    seen = []

    def broken(event):
        raise RuntimeError("observer bug")

    model = ScriptedModel([{"tool_calls": [{"name": "calculate", "arguments": {"expression": "1+1"}}]}, "2"])
    result = asyncio.run(run_rollout(TASK, ToolCallingAgent(), model, ToolEnvironment(demo_tools()),
                                     observers=[broken, seen.append]))
    kinds = [e.kind for e in seen]
    assert kinds == ["rollout_started", "env_ready", "model_call_done", "action_started", "action_executed",
                     "step_done", "model_call_done", "step_done", "rollout_finished"]
    assert seen[-1].data["exit_reason"] == "natural_completion"
    assert result.exit_reason == ExitReason.NATURAL_COMPLETION


def test_a_non_retryable_failure_says_so_in_its_record_on_every_wire():
    from cluster.workers.wire import decode_result, encode_result
    from rollout.errors import VerifierError
    from rollout.store.run_dir import StoredResult

    class NoAnswer:
        async def verify(self, task, result):
            raise VerifierError("task t has no data.answer", retryable=False)

    result = asyncio.run(run_rollout(TASK, ToolCallingAgent(), ScriptedModel(["fine"]), ToolEnvironment(demo_tools()),
                                     verifier=NoAnswer()))
    assert result.exit_reason == ExitReason.VERIFIER_ERROR and result.error.retryable is False
    assert decode_result(encode_result(result)).error.retryable is False  # the Ray wire (JSON)
    assert StoredResult.model_validate_json(result.model_dump_json()).error.retryable is False  # results.jsonl
    retried = swe(FailingRuntime(start_error=ContainerStartError("image missing")))
    assert retried.error.retryable is True


def test_a_config_problem_found_at_run_time_is_not_retried():
    from envs.runtimes.local import LocalRuntime

    result = swe(LocalRuntime({}))  # the model's commands on this host, not allowed: every attempt would fail
    assert result.status == "infra_failed" and "runtime.allow_host_exec" in result.error.message
    assert result.error.retryable is False
