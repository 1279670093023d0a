"""FunctionCallsParser: JSON tool calls inside ``<function_calls> ... </function_calls>`` blocks."""

from __future__ import annotations

import json
from typing import Any

from agents.parsers.common import configure, content_text, strip_thinking, unfence
from agents.parsers.json_scan import json_type, loads
from rollout.config.load import StrictModel
from rollout.errors import FormatError
from rollout.records import Action, Message


class FunctionCallsConfig(StrictModel):
    type: str = "function_calls"
    """The short name this config was selected by (``parser.type`` in YAML)."""
    open_tag: str = "<function_calls>"
    """Tag that opens a block of calls."""
    close_tag: str = "</function_calls>"
    """Tag that closes it."""
    allow_no_action: bool = False
    """Return ``[]`` (the model is done) for text with no block at all, instead of a FormatError."""
    max_actions: int | None = None
    """Refuse a message with more calls than this; None for no limit."""
    ignore_thinking: bool = True
    """Skip ``<think>...</think>`` spans: reasoning often quotes example calls."""


class FunctionCallsParser:
    """Every ``<function_calls>`` block in the content, in order. A block holds one JSON object
    per line, a single (possibly multi-line) object, or a JSON list of objects; each object is
    ``{"tool_name" | "name": ..., "parameters" | "arguments": {...}}`` (arguments may also be a
    JSON-encoded string). An unclosed block, bad JSON or a malformed call raises ``FormatError``.
    """

    def __init__(self, config: FunctionCallsConfig | None = None, **options: Any):
        self.config = configure(FunctionCallsConfig, config, options)
        c = self.config
        self.expected = (
            f'Expected format:\n{c.open_tag}\n{{"tool_name": "<tool name>", "parameters": {{...}}}}\n{c.close_tag}\n'
            "(one JSON object per line for several calls)."
        )

    def parse(self, message: Message) -> list[Action]:
        text = content_text(message)
        if self.config.ignore_thinking:
            text = strip_thinking(text)
        blocks = self._blocks(text)
        if not blocks:
            if self.config.allow_no_action:
                return []
            raise FormatError(f"No {self.config.open_tag} block found. {self.expected}")
        actions: list[Action] = []
        for number, body in enumerate(blocks, 1):
            for call in self._calls(body, number):
                actions.append(self._action(call))
        if not actions:
            raise FormatError(f"The {self.config.open_tag} block holds no calls. {self.expected}")
        limit = self.config.max_actions
        if limit is not None and len(actions) > limit:
            raise FormatError(f"Too many calls: {len(actions)} in one message; at most {limit} are allowed.")
        return actions

    def _blocks(self, text: str) -> list[str]:
        open_tag, close_tag = self.config.open_tag, self.config.close_tag
        blocks = []
        pos = 0
        while True:
            start = text.find(open_tag, pos)
            if start == -1:
                return blocks
            end = text.find(close_tag, start + len(open_tag))
            if end == -1:
                raise FormatError(f"The {open_tag} block is not closed: end it with {close_tag}. {self.expected}")
            blocks.append(text[start + len(open_tag) : end])
            pos = end + len(close_tag)

    def _calls(self, body: str, number: int) -> list[Any]:
        body = unfence(body.strip())
        if not body:
            return []
        where = f"{self.config.open_tag} block {number}" if number > 1 else self.config.open_tag
        value, error = loads(body)
        if error is None:
            return value if isinstance(value, list) else [value]
        lines = [line.strip() for line in body.splitlines() if line.strip()]
        if len(lines) == 1 or body.startswith("["):
            raise FormatError(f"JSON parse error in {where}: {error}. {self.expected}")
        calls = []
        for i, line in enumerate(lines, 1):
            value, error = loads(line)
            if error is not None:
                raise FormatError(f"JSON parse error in {where}, line {i}: {error}. {self.expected}")
            calls.append(value)
        return calls

    def _action(self, call: Any) -> Action:
        if not isinstance(call, dict):
            raise FormatError(f"Each call must be a JSON object, got {json_type(call)}. {self.expected}")
        name = call.get("tool_name", call.get("name"))
        if not isinstance(name, str) or not name.strip():
            raise FormatError(f'A call has no "tool_name" naming the tool. {self.expected}')
        name = name.strip()
        params = call.get("parameters", call.get("arguments"))
        if isinstance(params, str):  # arguments given as an encoded JSON string, OpenAI style
            decoded, error = loads(params) if params.strip() else ({}, None)
            if error is not None:
                raise FormatError(f"Invalid JSON in arguments of tool '{name}': {error}. {self.expected}")
            params = decoded
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise FormatError(f"Parameters of tool '{name}' must be a JSON object, got {json_type(params)}.")
        return Action(kind="tool", name=name, arguments=params, raw=json.dumps(call, ensure_ascii=False))
