"""What a part offers beyond its seam is declared, and the runner uses exactly what is declared: a model that ends
sessions is told each rollout ended (whatever the outcome), an environment in stages runs the agent once per stage,
and the capability flags are read from the class that declares them."""

from __future__ import annotations

import asyncio

from agents.reference_agents import OracleAgent
from agents.swe_agent import MiniSweAgent
from envs.runtimes.local import LocalRuntime
from envs.runtimes.null import NullRuntime
from envs.runtimes.output import output_limit
from envs.shell_env import ShellEnvironment
from rollout.errors import ExitReason, RuntimeFailure
from rollout.models.scripted import ScriptedModel
from rollout.protocols import AgentCapabilities, EndsSessions, EnvironmentCapabilities, HoldsSolution, Staged, declared
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


class SessionModel(ScriptedModel):
    """The scripted model, keeping a session per rollout as the HTTP client does."""

    def __init__(self, outputs):
        super().__init__(outputs)
        self.ended: list[str] = []

    async def end_session(self, meta: RequestMeta) -> None:
        self.ended.append(meta.rollout_id)


class TwoStages(ShellEnvironment):
    """A shell whose task has a second stage, with a prompt of its own."""

    def __init__(self):
        super().__init__(NullRuntime({"echo": True}))
        self.stages_given = 0

    async def next_stage(self) -> Task | None:
        if self.stages_given:
            return None
        self.stages_given += 1
        return Task(task_id="t", prompt="stage two")


def run(model, env, rollout_id="t#0"):
    meta = RequestMeta(rollout_id=rollout_id, task_id="t")
    return asyncio.run(run_rollout(Task(task_id="t", prompt="go"), MiniSweAgent(), model, env, meta=meta))


def test_a_model_that_ends_sessions_is_told_each_rollout_ended_whatever_its_outcome():
    model = SessionModel([SUBMIT])
    assert isinstance(model, EndsSessions) and not isinstance(ScriptedModel([]), EndsSessions)
    done = run(model, ShellEnvironment(NullRuntime({"echo": True})), "t#0")

    class Broken(NullRuntime):
        async def exec(self, *args, **kwargs):
            raise RuntimeFailure("container died")

    failed = run(model, ShellEnvironment(Broken()), "t#1")
    assert done.exit_reason == ExitReason.SUBMITTED and failed.status == "infra_failed"
    assert model.ended == ["t#0", "t#1"]


def test_an_environment_in_stages_runs_the_agent_on_every_stage_and_one_without_runs_once():
    env = TwoStages()
    assert isinstance(env, Staged) and not isinstance(ShellEnvironment(NullRuntime()), Staged)
    staged = run(ScriptedModel([SUBMIT, SUBMIT]), env)
    assert staged.exit_reason == ExitReason.SUBMITTED and env.stages_given == 1
    prompts = [m["content"] for m in staged.trajectory.messages if m["role"] == "user"]
    assert any("stage two" in p for p in prompts) and len(staged.trajectory.steps) == 2
    single = run(ScriptedModel([SUBMIT]), ShellEnvironment(NullRuntime({"echo": True})))
    assert len(single.trajectory.steps) == 1


def test_capability_flags_are_the_declaring_class_s_and_the_defaults_otherwise():
    class Plain:
        closes_sessions = True  # not declared: a class that does not inherit the flags sets none of them

    class Closer(EnvironmentCapabilities):
        closes_sessions = True

    assert declared(Closer, EnvironmentCapabilities).closes_sessions
    assert declared(Closer(), EnvironmentCapabilities).closes_sessions
    assert not declared(Plain, EnvironmentCapabilities).closes_sessions
    assert declared(MiniSweAgent, AgentCapabilities).speaks_responses_api is False
    assert declared(object(), AgentCapabilities).speaks_responses_api is True


class WithSolution(ShellEnvironment):
    """A shell whose task ships a reference solution (as a Harbor task's solve.sh)."""

    def __init__(self):
        super().__init__(NullRuntime({"echo": True}))

    async def run_reference_solution(self, timeout):
        return await self.runtime.exec("echo solved", timeout=timeout)


def test_the_oracle_runs_a_declared_reference_solution_and_names_an_environment_without_one():
    meta = RequestMeta(rollout_id="t#0", task_id="t")
    task = Task(task_id="t", prompt="go")
    assert isinstance(WithSolution(), HoldsSolution)
    assert not isinstance(ShellEnvironment(NullRuntime({"echo": True})), HoldsSolution)
    solved = asyncio.run(run_rollout(task, OracleAgent(), ScriptedModel([]), WithSolution(), meta=meta))
    assert solved.exit_reason == ExitReason.NATURAL_COMPLETION
    assert "solve.sh exited with 0" in solved.trajectory.exit_message
    refused = asyncio.run(run_rollout(task, OracleAgent(), ScriptedModel([]), ShellEnvironment(NullRuntime({})),
                                      meta=meta))
    assert refused.status == "infra_failed" and "has none (use environment.type harbor)" in refused.error.message


def test_a_runtime_declares_its_output_cap_or_has_none():
    assert output_limit(NullRuntime({})) is None  # no section with a cap: nothing to cut at
    assert output_limit(LocalRuntime({"max_output_bytes": 4096, "allow_host_exec": True})) == 4096
