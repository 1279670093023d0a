"""ToolCallingAgent: OpenAI function calling in sequential rounds (NeMo Gym's Simple agent).

Tools are offered every round; all tool calls of a round run before the next model call; each
result goes back as a ``role: tool`` message. Ends on a reply without tool calls (natural
completion) or any limit of ``rollout.termination``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agents.parsers import load_parser
from rollout.context import RolloutContext
from rollout.errors import EnvironmentDone, FormatError, NaturalCompletion
from rollout.protocols import ActionParser, Environment, Model
from rollout.records import Message, Observation, Step, Task
from rollout.termination import Limits


class ToolCallingAgentConfig(Limits):
    type: str = "tool_calling"
    system_prompt: str | None = None
    """Prepended as a system message unless the task brings its own ``messages``."""
    parser: str = "openai_tools"
    """How tool calls are read from a reply (short name or dotted path)."""
    parser_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the parser (e.g. ``{max_actions: 1}``)."""


class ToolCallingAgent:
    def __init__(self, config: ToolCallingAgentConfig | None = None, parser: ActionParser | None = None):
        self.config = config or ToolCallingAgentConfig()
        self.parser = parser or load_parser(self.config.parser, self.config.parser_options)

    def limits(self) -> Limits:
        return Limits.of(self.config)

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        reset = await ctx.reset_env(env, task)
        ctx.trajectory.tools = reset.tools
        ctx.add_messages(*task.opening_messages(self.config.system_prompt), *reset.messages)
        while True:
            step = await ctx.query(model, reset.tools)
            try:
                actions = self.parser.parse(step.message)
            except FormatError as exc:
                step.format_error = str(exc)
                ctx.add_messages(*format_error_replies(step.message, str(exc)))
                ctx.step_done(step)
                ctx.termination.format_error(str(exc))
                continue
            if not actions:
                ctx.step_done(step)
                raise NaturalCompletion("the model replied without tool calls", submission=text_of(step.message))
            step.actions.extend(actions)
            observations = await execute(env, step, ctx)
            ctx.add_messages(*(tool_reply(o) for o in observations))
            ctx.step_done(step)
            if any(o.done for o in observations):
                raise EnvironmentDone("the environment ended the episode", submission=text_of(step.message))
            ctx.termination.after_observations(observations)


async def execute(env: Environment, step: Step, ctx: RolloutContext) -> list[Observation]:
    return await ctx.execute(env, step, step.actions)


def tool_reply(obs: Observation) -> Message:
    return {"role": "tool", "tool_call_id": obs.call_id or "", "content": obs.content}


def format_error_replies(message: Message, feedback: str) -> list[Message]:
    """Every ``tool_calls[i].id`` must be answered before the next turn; otherwise a user message."""
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        return [{"role": "tool", "tool_call_id": str(c.get("id", "")), "content": feedback} for c in calls]
    return [{"role": "user", "content": feedback}]


def text_of(message: Message) -> str:
    content: Any = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""
