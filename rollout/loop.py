"""The turn loop, in one place: reset the environment → the opening messages → per turn: query the model,
parse the reply (a format error is fed back), execute the actions, add the observations, check the limits →
until an outcome ends the episode. ``rollout.runner.run_rollout`` wraps it (time limit, verify, close, result).

An agent is the ``Strategy`` the loop calls. ``LoopAgent`` gives it ``run`` (the loop drives generation) and
``session`` (a caller that owns generation, a trainer: ``reset``, ``step(output)``, ``should_continue``,
``summary``); both go through ``Episode.turn``, so they produce the same trajectory."""

from __future__ import annotations

import time
from typing import Any, Protocol

from pydantic import BaseModel

from rollout.context import RolloutContext
from rollout.errors import FormatError, TaskOutcome
from rollout.protocols import EnvReset, Environment, Model, ModelResponse
from rollout.records import Action, EpisodeSummary, ExitReason, Message, Observation, Step, Task
from rollout.termination import Limits


class Strategy(Protocol):
    """What an agent decides; the loop does everything else."""

    offers_tools: bool
    """Send the environment's tool schemas with every model call (function calling)."""

    def opening(self, task: Task, reset: EnvReset) -> list[Message]:
        """The conversation before the first model call."""
        ...

    def parse(self, message: Message) -> list[Action]:
        """The reply's actions; ``FormatError`` when it cannot be read."""
        ...

    def on_format_error(self, message: Message, error: FormatError) -> list[Message] | TaskOutcome:
        """The feedback for an unreadable reply, or the outcome it still is (e.g. a final answer)."""
        ...

    def on_no_actions(self, message: Message) -> TaskOutcome | None:
        """The outcome of a readable reply without actions (None: the turn goes on with none)."""
        ...

    def observe(self, observations: list[Observation]) -> list[Message]:
        """The messages that carry the observations back to the model."""
        ...

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        """The outcome of a turn whose actions ended the episode (a submission, the environment said done)."""
        ...


class Turn(BaseModel):
    """One caller-driven step, and whether the episode is over (``reward``: the environment's so far)."""

    turn_number: int
    model_output: str
    actions: list[Action]
    observation: str
    done: bool
    reward: float
    exit_reason: ExitReason | None = None
    format_error: str | None = None


class Episode:
    """One episode of a strategy in an environment, stepped by ``run`` or by a caller."""

    def __init__(self, agent: Strategy, env: Environment, ctx: RolloutContext):
        self.agent, self.env, self.ctx = agent, env, ctx
        self.tools: list[dict[str, Any]] | None = None
        self.done = False

    async def reset(self, task: Task) -> list[Message]:
        reset = await self.ctx.reset_env(self.env, task)
        self.tools = reset.tools
        if self.agent.offers_tools or reset.tools is not None:
            self.ctx.trajectory.tools = reset.tools
        self.ctx.add_messages(*self.agent.opening(task, reset))
        return list(self.ctx.messages)

    async def run(self, task: Task, model: Model) -> None:
        """The loop owns generation; it ends by raising the episode's ``TaskOutcome``."""
        await self.reset(task)
        tools = self.tools if self.agent.offers_tools else None
        while True:
            await self.turn(await self.ctx.query(model, tools))

    async def turn(self, step: Step) -> None:
        """Act on one recorded reply: parse, feed a format error back or execute and observe, check the limits.
        Raises the outcome when the turn ends the episode."""
        ctx, agent = self.ctx, self.agent
        try:
            actions = agent.parse(step.message)
        except FormatError as exc:
            feedback = agent.on_format_error(step.message, exc)
            if isinstance(feedback, TaskOutcome):
                ctx.step_done(step)
                raise feedback from None
            step.format_error = str(exc)
            ctx.add_messages(*feedback)
            ctx.step_done(step)
            ctx.termination.format_error(str(exc))
            return
        if not actions:
            outcome = agent.on_no_actions(step.message)
            if outcome is not None:
                ctx.step_done(step)
                raise outcome
        step.actions.extend(actions)
        observations = await ctx.execute(self.env, step, actions)
        ctx.add_messages(*agent.observe(observations))
        ctx.step_done(step)
        outcome = agent.ended(step.message, observations)
        if outcome is not None:
            raise outcome
        ctx.termination.after_observations(observations)

    # ---- caller-driven ------------------------------------------------------------------------------

    async def step(self, model_output: str | Message | ModelResponse) -> Turn:
        """Record the caller's generation, act on it, report the turn."""
        if isinstance(model_output, ModelResponse):
            response = model_output
        else:
            message = {"role": "assistant", "content": model_output} if isinstance(model_output, str) else model_output
            response = ModelResponse(message=dict(message))
        try:
            self.ctx.termination.before_model_call()
            step = self.ctx.record_reply(response, started=time.time(), seconds=0.0)
            self.ctx.termination.after_model_call(response)
            await self.turn(step)
        except TaskOutcome as outcome:
            self.finish(outcome)
        return self._turn(self.ctx.trajectory.steps[-1])

    def should_continue(self) -> bool:
        if self.done:
            return False
        if (limit := self.ctx.limits.max_steps) is not None and self.ctx.termination.steps >= limit:
            self.finish(None, ExitReason.STEP_LIMIT)
            return False
        return True

    def summary(self) -> EpisodeSummary:
        return self.ctx.trajectory.summary()

    def finish(self, outcome: TaskOutcome | None, reason: ExitReason | None = None) -> None:
        self.done = True
        traj = self.ctx.trajectory
        traj.exit_reason = outcome.exit_reason if outcome is not None else reason
        if outcome is not None and outcome.submission is not None:
            traj.submission = outcome.submission
        if traj.steps:
            traj.steps[-1].termination_reason = traj.exit_reason

    def _turn(self, step: Step) -> Turn:
        content = step.message.get("content")
        return Turn(
            turn_number=step.index,
            model_output=content if isinstance(content, str) else "",
            actions=step.actions,
            observation="\n".join(o.content for o in step.observations) or (step.format_error or ""),
            done=self.done,
            reward=self.ctx.trajectory.env_reward,
            exit_reason=self.ctx.trajectory.exit_reason,
            format_error=step.format_error,
        )


class LoopAgent:
    """Base of the agents the loop drives: ``run`` and ``session`` from the strategy hooks. Subclasses set
    ``config`` (a ``Limits`` subclass) and ``parser``."""

    config: Limits
    offers_tools = False

    def limits(self) -> Limits:
        return Limits.of(self.config)

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        await Episode(self, env, ctx).run(task, model)  # type: ignore[arg-type]

    def session(self, env: Environment, ctx: RolloutContext | None = None) -> Episode:
        return Episode(self, env, ctx or RolloutContext(limits=self.limits()))  # type: ignore[arg-type]

    def parse(self, message: Message) -> list[Action]:
        return self.parser.parse(message)  # type: ignore[attr-defined]

    def on_format_error(self, message: Message, error: FormatError) -> list[Message] | TaskOutcome:
        return [{"role": "user", "content": str(error)}]

    def on_no_actions(self, message: Message) -> TaskOutcome | None:
        return None

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        return None
