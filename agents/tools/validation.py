"""Checks a tool call's arguments against its ToolDefinition, strictly: the only coercion is
int -> float for ``number`` parameters; a missing optional parameter gets its declared default."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from agents.tools.tool import ToolDefinition, ToolParameter

_ARTICLE = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
}


def check_arguments(definition: ToolDefinition, params: Any) -> tuple[dict[str, Any], list[str]]:
    """The arguments to call the tool with, and every problem found (empty when they are valid).

    ``null`` for an optional parameter counts as leaving it out (strict-mode OpenAI clients
    send null for every optional field they do not use).
    """
    if not isinstance(params, dict):
        return {}, [f"arguments must be a JSON object, got {_show(params)}"]
    problems: list[str] = []
    known = {p.name for p in definition.parameters}
    for key in params:
        if key not in known:
            expected = ", ".join(sorted(known)) if known else "none"
            problems.append(f"unknown parameter '{key}' (parameters: {expected})")
    out: dict[str, Any] = {}
    for param in definition.parameters:
        value = params.get(param.name)
        if value is None:
            if param.required:
                problems.append(
                    f"missing required parameter '{param.name}'"
                    if param.name not in params
                    else f"parameter '{param.name}' must be {_ARTICLE[param.type]}, got null"
                )
            elif param.default is not None:
                out[param.name] = copy.deepcopy(param.default)
            continue
        ok, coerced, problem = check_value(param, value)
        if ok:
            out[param.name] = coerced
        else:
            problems.append(problem)
    return out, problems


def check_value(param: ToolParameter, value: Any) -> tuple[bool, Any, str]:
    """``(ok, value to pass, problem)`` for one parameter's value."""
    ok, coerced, wanted = _typed(param.type, value)
    if not ok:
        return False, value, f"parameter '{param.name}' must be {wanted}, got {_show(value)}"
    if param.type == "array" and param.items is not None:
        items = []
        for i, item in enumerate(coerced, 1):
            ok, item, wanted = _typed(param.items, item)
            if not ok:
                return False, value, f"parameter '{param.name}' item {i} must be {wanted}, got {_show(coerced[i - 1])}"
            items.append(item)
        coerced = items
    if param.enum is not None and not any(_same(coerced, choice) for choice in param.enum):
        choices = ", ".join(_show(c) for c in param.enum)
        return False, value, f"parameter '{param.name}' must be one of {choices}, got {_show(value)}"
    return True, coerced, ""


def _typed(kind: str, value: Any) -> tuple[bool, Any, str]:
    """``(ok, coerced, what was wanted)``; bool is never a number (it subclasses int in Python)."""
    wanted = _ARTICLE[kind]
    if kind == "string":
        return isinstance(value, str), value, wanted
    if kind == "boolean":
        return isinstance(value, bool), value, wanted
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool), value, wanted
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, value, wanted
        try:
            number = float(value)
        except OverflowError:
            return False, value, "a number in floating-point range"
        if not math.isfinite(number):
            return False, value, "a finite number"
        return True, number, wanted
    if kind == "array":
        return isinstance(value, list), value, wanted
    return isinstance(value, dict), value, wanted


def _same(value: Any, choice: Any) -> bool:
    # 1 == True in Python; an enum of booleans must not accept 1, nor one of ints accept True.
    return value == choice and isinstance(value, bool) == isinstance(choice, bool)


def _show(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # circular, or an int past Python's digit limit
        text = f"a {type(value).__name__} value"
    return text if len(text) <= limit else text[: limit - 3] + "..."
