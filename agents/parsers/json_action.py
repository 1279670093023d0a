"""JSONActionParser: actions written as JSON objects ``{"tool": name, "parameters": {...}}`` in the text."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from agents.parsers.common import configure, content_text, strip_thinking
from agents.parsers.json_scan import json_spans, json_type, loads
from rollout.config.load import StrictModel
from rollout.errors import FormatError
from rollout.records import Action, Message

EXPLAIN_SPANS = 100
"""How many non-action JSON spans are decoded to explain a reply that holds no action."""


class JSONActionConfig(StrictModel):
    type: str = "json"
    """The short name this config was selected by (``parser.type`` in YAML)."""
    tool_keys: list[str] = Field(default_factory=lambda: ["tool"])
    """Keys that name the tool; the first one present wins."""
    parameters_keys: list[str] = Field(default_factory=lambda: ["parameters", "arguments"])
    """Keys that hold the arguments object; the first one present wins. Missing means ``{}``."""
    allow_no_action: bool = False
    """Return ``[]`` (the model is done) for text with no attempt at an action, instead of a
    FormatError. Text that tries and fails (broken JSON with a tool key) still raises."""
    max_actions: int | None = None
    """Refuse a message with more actions than this; None for no limit."""
    ignore_thinking: bool = True
    """Skip ``<think>...</think>`` spans: reasoning often quotes example actions."""


class JSONActionParser:
    """Finds JSON objects anywhere in the message content: bare, inside a fenced ```json block,
    or surrounded by prose. Several objects, or a JSON list of objects, give several actions,
    in order. Objects without a tool key are ignored (prose may hold other JSON).

    Raises ``FormatError`` starting "JSON parse error: ..." when an object that names a tool
    does not decode, or when nothing decodes at all; "No JSON action found" when the text holds
    no JSON (unless ``allow_no_action``).
    """

    def __init__(self, config: JSONActionConfig | None = None, **options: Any):
        self.config = configure(JSONActionConfig, config, options)
        keys = self.config.tool_keys
        self.expected = (
            f'Expected format: {{"{keys[0]}": "<tool name>", "{self.config.parameters_keys[0]}": {{...}}}}'
            " (a JSON list of such objects for several actions)."
        )
        self._quoted_keys = [f'"{key}"' for key in keys]

    def parse(self, message: Message) -> list[Action]:
        text = content_text(message)
        if self.config.ignore_thinking:
            text = strip_thinking(text)
        actions: list[Action] = []
        action_starts: list[int] = []
        attempt_errors: list[tuple[int, str]] = []  # spans that name a tool but do not decode
        others: list[tuple[int, int, bool]] = []  # spans that name no tool: only decoded to explain
        non_action = False  # a span named a tool, decoded, and was still no action
        for start, end, closed in json_spans(text):
            if not self._names_tool(text, start, end):
                others.append((start, end, closed))
                continue
            value, error = _decode(text[start:end], closed)
            if error is not None:
                attempt_errors.append((start, error))
                continue
            found = self._actions(value)
            if found is None:
                non_action = True
            else:
                actions.extend(found)
                action_starts.append(start)
        for start, error in attempt_errors:
            if not self._stray(text, start, action_starts):
                raise FormatError(f"JSON parse error: {error}. {self.expected}")
        if actions:
            limit = self.config.max_actions
            if limit is not None and len(actions) > limit:
                raise FormatError(f"Too many actions: {len(actions)} in one message; at most {limit} are allowed.")
            return actions
        if self.config.allow_no_action:
            return []
        raise FormatError(self._explain_nothing(text, others, non_action))

    def _explain_nothing(self, text: str, others: list[tuple[int, int, bool]], non_action: bool) -> str:
        # Decode a bounded number of the other spans: enough to explain, linear on any input.
        for start, end, closed in others[:EXPLAIN_SPANS]:
            _, error = _decode(text[start:end], closed)
            if error is not None:
                return f"JSON parse error: {error}. {self.expected}"
        if others or non_action:
            return f'Found JSON, but no object with a "{self.config.tool_keys[0]}" key. {self.expected}'
        return f"No JSON action found in the reply. {self.expected}"

    def _stray(self, text: str, start: int, action_starts: list[int]) -> bool:
        """An unclosed span is a stray brace in prose if a good action follows it with no tool key
        in between; otherwise it is a broken action and must not be skipped silently."""
        later = next((s for s in action_starts if s > start), None)
        return later is not None and not self._names_tool(text, start, later)

    def _names_tool(self, text: str, start: int, end: int) -> bool:
        return any(text.find(quoted, start, end) != -1 for quoted in self._quoted_keys)

    def _actions(self, value: Any) -> list[Action] | None:
        """The actions a decoded value holds, or None if it is not an action at all."""
        if isinstance(value, dict):
            return [self._action(value, "")] if self._tool_key(value) else None
        if isinstance(value, list) and any(isinstance(v, dict) and self._tool_key(v) for v in value):
            out = []
            for i, item in enumerate(value, 1):
                if not isinstance(item, dict) or not self._tool_key(item):
                    raise FormatError(
                        f'Item {i} of the JSON list is not an action: it needs a "{self.config.tool_keys[0]}" key.'
                        f" {self.expected}"
                    )
                out.append(self._action(item, f"item {i}: "))
            return out
        return None

    def _tool_key(self, obj: dict[str, Any]) -> str | None:
        return next((k for k in self.config.tool_keys if k in obj), None)

    def _action(self, obj: dict[str, Any], where: str) -> Action:
        key = self._tool_key(obj)
        name = obj[key]
        if not isinstance(name, str) or not name.strip():
            raise FormatError(f'{where}"{key}" must be a non-empty string naming the tool. {self.expected}')
        name = name.strip()
        params_key = next((k for k in self.config.parameters_keys if k in obj), None)
        params: Any = {} if params_key is None else obj[params_key]
        if isinstance(params, str):  # arguments given as an encoded JSON string
            decoded, error = loads(params) if params.strip() else ({}, None)
            params = decoded if error is None else params
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise FormatError(
                f"{where}\"{params_key}\" of tool '{name}' must be a JSON object, got {json_type(params)}."
                f" {self.expected}"
            )
        return Action(kind="tool", name=name, arguments=params, raw=json.dumps(obj, ensure_ascii=False))


def _decode(chunk: str, closed: bool) -> tuple[Any, str | None]:
    value, error = loads(chunk)
    if error is None and not closed:  # a never-closed span cannot be whole JSON; guard anyway
        error = "unterminated JSON"
    return value, error
