"""ReActParser: ``Thought: ... / Action: name / Action Input: {json}`` text, or ``Final Answer: ...``."""

from __future__ import annotations

from typing import Any

from agents.parsers.common import configure, content_text, strip_thinking, unfence
from agents.parsers.json_scan import json_type, loads, span_end
from rollout.config.load import StrictModel
from rollout.errors import FormatError
from rollout.records import Action, Message

# Longest first: "action input" must not be read as "action" followed by " input".
_KEYWORDS = ("action input", "action", "thought", "final answer", "observation")
_DECORATION = " \t*#>-_`"


class ReActConfig(StrictModel):
    type: str = "react"
    """The short name this config was selected by (``parser.type`` in YAML)."""
    string_input_key: str | None = "input"
    """An Action Input that is not a JSON object becomes ``{string_input_key: text}`` (for
    single-argument tools); None makes such input a FormatError instead."""
    ignore_thinking: bool = True
    """Skip ``<think>...</think>`` spans: reasoning often quotes example actions."""


EXPECTED = (
    "Expected format:\n"
    "Thought: <your reasoning>\n"
    "Action: <tool name>\n"
    "Action Input: <JSON object of arguments>\n"
    "or, when you are done:\n"
    "Final Answer: <your answer>"
)


class ReActParser:
    """One action per reply, from ``Action:`` and the ``Action Input:`` that follows it.

    Keywords are case-insensitive and may carry markdown decoration (``**Action:**``). The
    Action Input runs to the next keyword line; it may be a JSON object (possibly in a code
    fence) or, for single-argument tools, plain text, which becomes ``{"input": text}``.
    Missing Action Input means ``{}``. Anything from the first ``Observation:`` line on is
    ignored: models often invent the observation they expect.

    A ``Final Answer:`` line before any ``Action:`` line means the model is done: ``parse``
    returns ``[]`` and ``final_answer`` gives the answer text. No Action and no Final Answer
    raises ``FormatError``.
    """

    def __init__(self, config: ReActConfig | None = None, **options: Any):
        self.config = configure(ReActConfig, config, options)

    def parse(self, message: Message) -> list[Action]:
        lines = self._lines(message)
        for i, (key, rest) in enumerate(lines):
            if key == "final answer":
                return []
            if key == "observation":
                break
            if key == "action":
                return [self._action(rest, lines[i + 1 :])]
        if any(key == "action input" for key, _ in lines):
            raise FormatError(f"Found 'Action Input:' but no 'Action:' line naming the tool. {EXPECTED}")
        raise FormatError(f"No 'Action:' line found. {EXPECTED}")

    def final_answer(self, message: Message) -> str | None:
        """The text after ``Final Answer:`` (to the end of the reply), or None if there is none."""
        lines = self._lines(message)
        for i, (key, rest) in enumerate(lines):
            if key in ("action", "observation"):
                return None
            if key == "final answer":
                return "\n".join([rest] + [text for _, text in lines[i + 1 :]]).strip()
        return None

    def _lines(self, message: Message) -> list[tuple[str | None, str]]:
        """Each line as (keyword or None, the text after the colon, or the whole line)."""
        text = content_text(message)
        if self.config.ignore_thinking:
            text = strip_thinking(text)
        return [_keyword(line) for line in text.splitlines()]

    def _action(self, rest: str, following: list[tuple[str | None, str]]) -> Action:
        name = rest.strip(_DECORATION + "\"'")
        if not name:
            raise FormatError(f"The 'Action:' line names no tool. {EXPECTED}")
        input_lines: list[str] | None = None
        for key, text in following:
            if input_lines is None:
                if key == "action input":
                    input_lines = [text]
                elif key is not None:
                    break
            elif key is None:
                input_lines.append(text)
            else:
                break
        raw = "\n".join(input_lines).strip() if input_lines is not None else ""
        return Action(kind="tool", name=name, arguments=self._arguments(name, raw), raw=raw)

    def _arguments(self, name: str, raw: str) -> dict[str, Any]:
        body = unfence(raw)
        if not body:
            return {}
        if body[0] in "{[":
            end = span_end(body, 0)  # the object, without any prose after it
            chunk = body if end is None else body[:end]
            value, error = loads(chunk)
            if error is not None:
                raise FormatError(f"Action Input of tool '{name}' is not valid JSON: {error}. {EXPECTED}")
            if not isinstance(value, dict):
                raise FormatError(f"Action Input of tool '{name}' must be a JSON object, got {json_type(value)}.")
            return value
        if self.config.string_input_key is None:
            raise FormatError(f"Action Input of tool '{name}' must be a JSON object. {EXPECTED}")
        if body[0] == '"':  # a JSON string literal: decode escapes, drop the quotes
            value, error = loads(body)
            if error is None and isinstance(value, str):
                body = value
        return {self.config.string_input_key: body}


def _keyword(line: str) -> tuple[str | None, str]:
    stripped = line.lstrip(_DECORATION)
    head = stripped[:16].lower()
    for key in _KEYWORDS:
        if head.startswith(key):
            rest = stripped[len(key) :].lstrip(" \t*_")
            if rest.startswith(":"):
                return key, rest[1:].lstrip(" \t*_").rstrip()
    return None, line
