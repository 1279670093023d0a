"""The turn loop, in one place: reset the environment → the opening messages → per turn: check the limits, query
the model on the prompt the agent shows it, parse the reply (a format error is fed back), execute the actions, add
the observations → until an outcome ends the episode (``Episode.finish`` records it). ``rollout.runner.run_rollout``
wraps it (time limit, verify, close, result).

An agent is the ``Strategy`` the loop calls. ``LoopAgent`` gives it ``run`` (the loop drives generation) and
``session`` (a caller that owns generation, e.g. a trainer batching the model calls of many episodes: ``reset``,
``should_continue``, ``request`` (the next call's messages and tools), ``step(output)``, ``summary``); both go
through the same limits, prompt and ``Episode.turn``, so they produce the same trajectory."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rollout.context import RolloutContext
from rollout.errors import FormatError, TaskOutcome
from rollout.protocols import AgentCapabilities, Environment, Model, ModelResponse
from rollout.records import Action, EpisodeSummary, ExitReason, Message, Observation, Step, Task, Trajectory
from rollout.strategy import Strategy
from rollout.termination import Limits


@dataclass(frozen=True)
class Request:
    """A model call of the episode: the prompt as the agent shows it, the tools to offer (None: no tools)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None


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
        """The loop owns generation; it ends by raising the episode's ``TaskOutcome``, recorded first."""
        try:
            await self.reset(task)
            while True:
                self.before_query()
                request = self.request()
                await self.turn(await self.ctx.query(model, request.messages, request.tools))
        except TaskOutcome as outcome:
            self.finish(outcome)
            raise

    def request(self) -> Request:
        """The messages and tools of the next model call."""
        return Request(list(self.agent.prompt(self.ctx.messages)), self.tools if self.agent.offers_tools else None)

    def before_query(self) -> None:
        """Raises the outcome of a limit the next model call would pass: the rollout's (``Termination``, which then
        counts the call), the agent's own budget."""
        self.ctx.termination.before_model_call()
        self._agent_budget()

    def _agent_budget(self) -> None:
        outcome = self.agent.before_query(self.ctx.trajectory)
        if outcome is not None:
            raise outcome

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
            self.before_query()
            step = self.ctx.record_reply(response, started=time.time(), seconds=0.0)
            self.ctx.termination.after_model_call(response)
            await self.turn(step)
        except TaskOutcome as outcome:
            self.finish(outcome)
        return self._turn(self.ctx.trajectory.steps[-1])

    def should_continue(self) -> bool:
        """Whether the caller generates again: not once the episode is over, nor when a limit would refuse the next
        call (``Termination``, the agent's own budget), which ends the episode."""
        if self.done:
            return False
        try:
            self.ctx.termination.check()
            self._agent_budget()
        except TaskOutcome as outcome:
            self.finish(outcome)
            return False
        return True

    def summary(self) -> EpisodeSummary:
        return self.ctx.trajectory.summary()

    def finish(self, outcome: TaskOutcome) -> None:
        """The episode is over: its exit recorded on the trajectory (reason, submission, message, last step)."""
        self.done = True
        self.ctx.record_exit(outcome)

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


class LoopAgent(AgentCapabilities):
    """Base of the agents the loop drives: ``run`` and ``session`` from the strategy hooks. Subclasses set
    ``config`` (a ``Limits`` subclass) and ``parser``, and the capability flags they have (``AgentCapabilities``)."""

    config: Limits
    offers_tools = False

    def limits(self) -> Limits:
        return Limits.of(self.config)

    def for_episode(self) -> LoopAgent:
        """The strategy of one episode: the agent itself (shared by rollouts), or a fresh copy in an agent that
        remembers something within an episode."""
        return self

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        await Episode(self.for_episode(), env, ctx).run(task, model)  # type: ignore[arg-type]

    def session(self, env: Environment, ctx: RolloutContext | None = None) -> Episode:
        return Episode(self.for_episode(), env, ctx or RolloutContext(limits=self.limits()))  # type: ignore[arg-type]

    def parse(self, message: Message) -> list[Action]:
        return self.parser.parse(message)  # type: ignore[attr-defined]

    def on_format_error(self, message: Message, error: FormatError) -> list[Message] | TaskOutcome:
        return [{"role": "user", "content": str(error)}]

    def on_no_actions(self, message: Message) -> TaskOutcome | None:
        return None

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        return None

    def prompt(self, messages: list[Message]) -> list[Message]:
        return messages

    def before_query(self, trajectory: Trajectory) -> TaskOutcome | None:
        return None
