"""The fields of a caller's Responses create request, checked as OpenAI's Responses API types them, before any work:
a field of the wrong type is the caller's mistake (422 naming it), not a rollout that fails on the farm later.

Only the fields this server reads or passes to the engine are checked (``input`` by ``chat_messages``); the
others OpenAI defines (``reasoning``, ``store``, ...) are carried through untouched.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

TOOL_CHOICES = ("none", "auto", "required")


def _number(low: float, high: float, low_open: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and (low < value if low_open else low <= value) and value <= high)
        return None if ok else f"a number {'>' if low_open else '>='} {low:g} and <= {high:g}"
    return check


def _integer(low: int | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)
        return None if ok else "an integer" + ("" if low is None else f" >= {low}")
    return check


def _of(kind: type, name: str) -> Callable[[Any], str | None]:
    return lambda value: None if isinstance(value, kind) else name


def _strings(value: Any) -> str | None:
    ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(s, str) for s in value))
    return None if ok else "a string or a list of strings"


def _metadata(value: Any) -> str | None:
    ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return None if ok else "an object of string values"


def _stream(value: Any) -> str | None:
    return None if value is False else "false: this server answers whole responses, not streams"


def _tool_choice(value: Any) -> str | None:
    if value in TOOL_CHOICES:
        return None
    if isinstance(value, Mapping) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return None
    return "'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}"


FIELDS: dict[str, Callable[[Any], str | None]] = {
    "model": _of(str, "a string"),
    "instructions": _of(str, "a string"),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1, low_open=True),
    "max_output_tokens": _integer(1),
    "seed": _integer(),
    "parallel_tool_calls": _of(bool, "true or false"),
    "tool_choice": _tool_choice,
    "stop": _strings,
    "metadata": _metadata,
    "user": _of(str, "a string"),
    "stream": _stream,
}
"""Field → its check (the reason it fails, or None). ``null`` is always allowed (the field is then unset)."""


def _tools(tools: Any) -> str | None:
    """Why ``tools`` is not a list of function tools (the path inside it first), or None."""
    if not isinstance(tools, list):
        return f": a list of tools, not {_shown(tools)}"
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            return f"[{i}]: a tool object"
        kind = tool.get("type", "function")
        if kind != "function":
            return f"[{i}].type: 'function' (the only tools this server runs), not {kind!r}"
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            return f"[{i}].name: a non-empty string"
        for field, check, name in (("parameters", Mapping, "a JSON schema object"),
                                   ("description", str, "a string"), ("strict", bool, "true or false")):
            if tool.get(field) is not None and not isinstance(tool[field], check):
                return f"[{i}].{field}: {name}"
    return None


def request_problem(params: Mapping[str, Any]) -> str | None:
    """The first field of ``params`` that is not what OpenAI's Responses API takes, as ``field: what it must be``;
    None when every checked field is."""
    if params.get("tools") is not None:
        problem = _tools(params["tools"])
        if problem is not None:
            return "tools" + problem
    for field, check in FIELDS.items():
        value = params.get(field)
        if value is not None:
            problem = check(value)
            if problem is not None:
                return f"{field}: {problem}, not {_shown(value)}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
