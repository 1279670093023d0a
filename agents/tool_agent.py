"""ToolCallingAgent: OpenAI function calling in sequential rounds (NeMo Gym's Simple agent).

Tools are offered every round; all tool calls of a round run before the next model call; each result goes
back as a ``role: tool`` message. Ends on a reply without tool calls (natural completion), when the
environment says done, or at any limit of ``rollout.termination``. The loop is ``rollout.loop``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agents.parsers import load_parser
from rollout.context import message_text
from rollout.errors import EnvironmentDone, FormatError, NaturalCompletion, TaskOutcome
from rollout.loop import LoopAgent
from rollout.protocols import ActionParser, EnvReset
from rollout.records import Message, Observation, Task
from rollout.termination import Limits


class ToolCallingAgentConfig(Limits):
    type: str = "tool_calling"
    system_prompt: str | None = None
    """Prepended as a system message unless the task brings its own ``messages``."""
    parser: str = "openai_tools"
    """How tool calls are read from a reply (short name or dotted path)."""
    parser_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the parser (e.g. ``{max_actions: 1}``)."""


class ToolCallingAgent(LoopAgent):
    offers_tools = True

    def __init__(self, config: ToolCallingAgentConfig | None = None, parser: ActionParser | None = None):
        self.config = config or ToolCallingAgentConfig()
        self.parser = parser or load_parser(self.config.parser, self.config.parser_options)

    def opening(self, task: Task, reset: EnvReset) -> list[Message]:
        return [*task.opening_messages(self.config.system_prompt), *reset.messages]

    def on_format_error(self, message: Message, error: FormatError) -> list[Message]:
        """Every ``tool_calls[i].id`` must be answered before the next turn; otherwise a user message."""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            return [{"role": "tool", "tool_call_id": str(c.get("id", "")), "content": str(error)} for c in calls]
        return [{"role": "user", "content": str(error)}]

    def on_no_actions(self, message: Message) -> TaskOutcome:
        return NaturalCompletion("the model replied without tool calls", submission=message_text(message))

    def observe(self, observations: list[Observation]) -> list[Message]:
        return [{"role": "tool", "tool_call_id": o.call_id or "", "content": o.content} for o in observations]

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        if any(o.done for o in observations):
            return EnvironmentDone("the environment ended the episode", submission=message_text(message))
        return None
