"""TextActionAgent: actions parsed from plain text (JSON, ReAct, <function_calls>), multi-turn.

Two ways to drive it. ``run`` owns generation, like every agent. ``session(env)`` hands the
loop to a caller that owns generation (a trainer): ``reset(task)`` → messages, then
``step(model_output)`` → ``Turn`` until ``should_continue()`` is false, then ``summary()``.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from agents.parsers import load_parser
from rollout.context import RolloutContext
from rollout.errors import EnvironmentDone, FormatError, NaturalCompletion, TaskOutcome
from rollout.protocols import ActionParser, Environment, Model, ModelResponse
from rollout.records import Action, EpisodeSummary, ExitReason, Message, Step, Task
from rollout.termination import Limits

DEFAULT_SYSTEM_PROMPT = """You solve the task by calling tools, one or more per turn.
{tools}
Reply with {format}. Each tool result comes back as an observation. When you are done, reply with
"Final Answer: " and your answer, and no action."""

FORMATS = {
    "json": 'a JSON object {"tool": "<name>", "parameters": {...}}',
    "react": "Thought: ..., Action: <tool name>, Action Input: <JSON arguments> (or Final Answer: ...)",
    "function_calls": '<function_calls>{"tool_name": "<name>", "parameters": {...}}</function_calls>',
}


class TextActionAgentConfig(Limits):
    type: str = "text_action"
    parser: str = "json"
    """Short name or dotted path of the parser that reads actions out of the reply text."""
    parser_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the parser (e.g. ``{max_actions: 1}``)."""
    system_prompt: str | None = None
    """``{tools}`` and ``{format}`` are filled in; default: a short description of both."""
    observation_prefix: str = "Observation: "
    """Prefix of the user message that carries each tool result back."""
    final_answer_marker: str = "Final Answer:"
    """A reply holding this and no action ends the episode; the text after it is the submission."""


class Turn(BaseModel):
    """One caller-driven step (seed 3's Turn), plus whether the episode is over."""

    turn_number: int
    model_output: str
    actions: list[Action]
    observation: str
    done: bool
    reward: float
    """Reward handed out by the environment so far."""
    exit_reason: ExitReason | None = None
    format_error: str | None = None


class TextActionAgent:
    def __init__(self, config: TextActionAgentConfig | None = None, parser: ActionParser | None = None):
        self.config = config or TextActionAgentConfig()
        self.parser = parser or load_parser(self.config.parser, self.config.parser_options)

    def limits(self) -> Limits:
        return Limits.of(self.config)

    def session(self, env: Environment, ctx: RolloutContext | None = None) -> "TextActionSession":
        return TextActionSession(self, env, ctx or RolloutContext(limits=self.limits()))

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        session = TextActionSession(self, env, ctx)
        await session.reset(task)
        while True:
            step = await ctx.query(model)
            await session.consume(step)

    def system_prompt(self, tools: list[dict[str, Any]] | None) -> str:
        lines = [
            f"- {t['function']['name']}: {t['function'].get('description', '')} "
            f"parameters: {t['function'].get('parameters', {}).get('properties', {})}"
            for t in tools or []
        ]
        listing = ("Tools:\n" + "\n".join(lines)) if lines else ""
        template = self.config.system_prompt or DEFAULT_SYSTEM_PROMPT
        return template.format(tools=listing, format=FORMATS.get(self.config.parser, "the expected action format"))


class TextActionSession:
    """One episode of a TextActionAgent, stepped by the agent's own loop or by a caller."""

    def __init__(self, agent: TextActionAgent, env: Environment, ctx: RolloutContext):
        self.agent, self.env, self.ctx = agent, env, ctx
        self.done = False

    async def reset(self, task: Task) -> list[Message]:
        reset = await self.ctx.reset_env(self.env, task)
        self.ctx.trajectory.tools = reset.tools
        opening = task.opening_messages(self.agent.system_prompt(reset.tools))
        self.ctx.add_messages(*opening, *reset.messages)
        return list(self.ctx.messages)

    async def step(self, model_output: str | Message | ModelResponse) -> Turn:
        """Caller-driven: record the caller's generation, act on it, report the turn."""
        if isinstance(model_output, ModelResponse):
            response = model_output
        else:
            message = {"role": "assistant", "content": model_output} if isinstance(model_output, str) else model_output
            response = ModelResponse(message=message)
        step = Step(
            index=len(self.ctx.trajectory.steps) + 1,
            message=dict(response.message),
            finish_reason=response.finish_reason,
            started_at=time.time(),
            usage=response.usage,
            prompt_token_ids=response.prompt_token_ids,
            completion_token_ids=response.completion_token_ids,
            logprobs=response.logprobs,
        )
        try:
            self.ctx.termination.before_model_call()
            self.ctx.trajectory.steps.append(step)
            self.ctx.trajectory.messages.append(step.message)
            self.ctx.termination.after_model_call(response)
            await self.consume(step)
        except TaskOutcome as outcome:
            self.finish(outcome)
        return self._turn(step)

    def should_continue(self) -> bool:
        limits = self.ctx.limits
        if self.done:
            return False
        if limits.max_steps is not None and self.ctx.termination.steps >= limits.max_steps:
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

    async def consume(self, step: Step) -> None:
        """Parse the reply, run its actions, append the observations. Raises the outcome at the end."""
        ctx = self.ctx
        text = step.message.get("content")
        text = text if isinstance(text, str) else ""
        marker = self.agent.config.final_answer_marker
        try:
            actions = self.agent.parser.parse(step.message)
        except FormatError as exc:
            if marker and marker in text:
                ctx.step_done(step)
                raise NaturalCompletion("final answer", submission=text.split(marker, 1)[1].strip()) from None
            step.format_error = str(exc)
            ctx.add_messages({"role": "user", "content": str(exc)})
            ctx.step_done(step)
            ctx.termination.format_error(str(exc))
            return
        if not actions:
            ctx.step_done(step)
            answer = text.split(marker, 1)[1].strip() if marker and marker in text else text
            raise NaturalCompletion("the reply holds no action", submission=answer)
        step.actions.extend(actions)
        observations = await ctx.execute(self.env, step, actions)
        prefix = self.agent.config.observation_prefix
        ctx.add_messages(*({"role": "user", "content": f"{prefix}{o.content}"} for o in observations))
        ctx.step_done(step)
        if any(o.done for o in observations):
            raise EnvironmentDone("the environment ended the episode")
        ctx.termination.after_observations(observations)

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
