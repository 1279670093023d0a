"""The agents that check a task rather than solve it: ``oracle`` runs the task's reference solution (a Harbor task's
``solution/solve.sh``), ``nop`` does nothing. A task whose oracle does not reach reward 1, or whose nop does not get
0, is a broken task (``rollout check-tasks``). Neither calls the model.

The oracle needs an environment that holds a reference solution (``rollout.protocols.HoldsSolution``: the harbor
environment); the solution is copied in for it alone, never for a model-driven agent. Both end with a natural
completion: the verifier then grades what the environment holds.
"""

from __future__ import annotations

from typing import Any, Mapping

from rollout.context import RolloutContext
from rollout.errors import AgentProtocolError, NaturalCompletion, TimeLimitExceeded
from rollout.protocols import Environment, HoldsSolution, Model
from rollout.records import Task
from rollout.termination import Limits

_TAIL = 2000
"""Characters of the solution's output kept in the trajectory's exit message."""


class ReferenceAgentConfig(Limits):
    type: str = "oracle"


class _ReferenceAgent:
    def __init__(self, config: ReferenceAgentConfig | Mapping[str, Any] | None = None):
        self.config = config if isinstance(config, ReferenceAgentConfig) else ReferenceAgentConfig(**(config or {}))

    def limits(self) -> Limits:
        return Limits.of(self.config)


class OracleAgent(_ReferenceAgent):
    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        if not isinstance(env, HoldsSolution):
            raise AgentProtocolError(f"the oracle agent runs a task's reference solution, and environment "
                                     f"{type(env).__name__} has none (use environment.type harbor)")
        await ctx.reset_env(env, task)
        out = await env.run_reference_solution(ctx.limits.time_limit)
        if out.timed_out:
            raise TimeLimitExceeded(f"solve.sh ran past its time limit: {out.output[-_TAIL:]}")
        raise NaturalCompletion(f"solve.sh exited with {out.returncode}: {out.output[-_TAIL:]}")


class NopAgent(_ReferenceAgent):
    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        await ctx.reset_env(env, task)
        raise NaturalCompletion("the nop agent does nothing")
