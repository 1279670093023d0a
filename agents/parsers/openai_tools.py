"""OpenAIToolsParser: actions from an assistant message's native ``tool_calls`` (function calling)."""

from __future__ import annotations

import json
from typing import Any

from agents.parsers.common import configure, scrub, scrub_json, snippet
from agents.parsers.json_scan import json_type, loads
from rollout.config.load import StrictModel
from rollout.errors import FormatError
from rollout.records import Action, Message


class OpenAIToolsConfig(StrictModel):
    type: str = "openai_tools"
    """The short name this config was selected by (``parser.type`` in YAML)."""
    max_calls: int | None = None
    """Refuse a message with more tool calls than this (FormatError); None for no limit."""


class OpenAIToolsParser:
    """Reads ``message["tool_calls"]`` only; the message text is never looked at.

    A message without tool calls returns ``[]``: in function calling, an answer with no tool
    call is how the model says it is done, so the agent treats it as natural completion.
    A call whose ``arguments`` is not a JSON object raises ``FormatError`` naming the tool and
    the JSON error (the whole message is refused: running half of the calls would surprise).
    Empty ``arguments`` mean ``{}``; arguments already given as a mapping are accepted.
    """

    def __init__(self, config: OpenAIToolsConfig | None = None, **options: Any):
        self.config = configure(OpenAIToolsConfig, config, options)

    def parse(self, message: Message) -> list[Action]:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls:
            return []
        if not isinstance(calls, list):
            raise FormatError(f"tool_calls must be a list of tool calls, got {type(calls).__name__}.")
        limit = self.config.max_calls
        if limit is not None and len(calls) > limit:
            raise FormatError(f"Too many tool calls: {len(calls)} in one message; at most {limit} are allowed.")
        return [self._action(i, call) for i, call in enumerate(calls, 1)]

    def _action(self, index: int, call: Any) -> Action:
        if not isinstance(call, dict):
            raise FormatError(f"Tool call #{index} is not an object.")
        function = call.get("function")
        if not isinstance(function, dict):
            raise FormatError(f"Tool call #{index} has no function.")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise FormatError(f"Tool call #{index} has no function name.")
        name = scrub(name.strip())
        raw_args = function.get("arguments")
        arguments, raw = _arguments(name, raw_args)
        call_id = call.get("id")
        return Action(
            kind="tool",
            name=name,
            arguments=arguments,
            call_id=scrub(call_id) if isinstance(call_id, str) else None,
            raw=raw,
        )


def _arguments(name: str, raw: Any) -> tuple[dict[str, Any], str]:
    """Decoded arguments and the raw string they came from."""
    if raw is None:
        return {}, ""
    if isinstance(raw, dict):  # some clients hand arguments over already decoded
        return scrub_json(raw), scrub(json.dumps(raw, ensure_ascii=False, default=str))
    if not isinstance(raw, str):
        raise FormatError(f"Arguments of tool '{name}' must be a JSON object string, got {type(raw).__name__}.")
    raw = scrub(raw)
    if not raw.strip():
        return {}, raw
    value, error = loads(raw)
    if error is not None:
        raise FormatError(f"Invalid JSON in arguments of tool '{name}': {error}. Arguments must be a JSON object.")
    if not isinstance(value, dict):
        raise FormatError(f"Arguments of tool '{name}' must be a JSON object, got {json_type(value)}: {snippet(raw)}")
    return value, raw
