"""TextActionAgent: actions parsed from plain text (JSON, ReAct, <function_calls>), multi-turn.

A reply holding the final-answer marker and no action ends the episode with the text after the marker.
Like every loop agent (``rollout.loop``) it runs the loop itself (``run``) or is stepped by a caller that
owns generation (``session(env)``: ``reset(task)``, ``should_continue()``, ``request()``, ``step(model_output)``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agents.parsers import load_parser
from rollout.context import message_text
from rollout.errors import EnvironmentDone, FormatError, NaturalCompletion, TaskOutcome
from rollout.loop import Episode, LoopAgent, Turn
from rollout.protocols import ActionParser, EnvReset
from rollout.records import Message, Observation, Task
from rollout.termination import Limits

TextActionSession = Episode
"""The caller-driven episode (kept under its earlier name)."""
__all__ = ["TextActionAgent", "TextActionAgentConfig", "TextActionSession", "Turn"]

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


class TextActionAgent(LoopAgent):
    def __init__(self, config: TextActionAgentConfig | None = None, parser: ActionParser | None = None):
        self.config = config or TextActionAgentConfig()
        self.parser = parser or load_parser(self.config.parser, self.config.parser_options)

    def opening(self, task: Task, reset: EnvReset) -> list[Message]:
        return [*task.opening_messages(self.system_prompt(reset.tools)), *reset.messages]

    def system_prompt(self, tools: list[dict[str, Any]] | None) -> str:
        lines = [f"- {t['function']['name']}: {t['function'].get('description', '')} "
                 f"parameters: {t['function'].get('parameters', {}).get('properties', {})}" for t in tools or []]
        listing = ("Tools:\n" + "\n".join(lines)) if lines else ""
        template = self.config.system_prompt or DEFAULT_SYSTEM_PROMPT
        return template.format(tools=listing, format=FORMATS.get(self.config.parser, "the expected action format"))

    def on_format_error(self, message: Message, error: FormatError) -> list[Message] | TaskOutcome:
        answer = self._answer(message)
        if answer is not None:
            return NaturalCompletion("final answer", submission=answer)
        return [{"role": "user", "content": str(error)}]

    def on_no_actions(self, message: Message) -> TaskOutcome:
        answer = self._answer(message)
        submission = message_text(message) if answer is None else answer
        return NaturalCompletion("the reply holds no action", submission=submission)

    def observe(self, observations: list[Observation]) -> list[Message]:
        return [{"role": "user", "content": f"{self.config.observation_prefix}{o.content}"} for o in observations]

    def ended(self, message: Message, observations: list[Observation]) -> TaskOutcome | None:
        return EnvironmentDone("the environment ended the episode") if any(o.done for o in observations) else None

    def _answer(self, message: Message) -> str | None:
        marker, text = self.config.final_answer_marker, message_text(message)
        return text.split(marker, 1)[1].strip() if marker and marker in text else None
