"""Find JSON objects and lists inside prose in linear time, and decode them with readable errors."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from agents.parsers.common import scrub_json

# Outside strings only brackets and quotes matter; inside a string, one anchored match jumps to
# its closing quote. Both patterns are linear: their alternatives never overlap.
_STRUCTURAL = re.compile(r'[{}\[\]"]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

MAX_UNCLOSED = 8
"""How many never-closed openers ``json_spans`` reports (a 1 MB run of ``{`` has a million)."""


def json_spans(text: str, openers: str = "{[") -> list[tuple[int, int, bool]]:
    """Outermost bracket-balanced spans ``(start, end, closed)`` that start with one of
    ``openers``, in text order.

    One pass with a stack of open brackets; brackets inside JSON strings are skipped (strings
    are only tracked inside brackets, so quotes in prose do not matter). A stray opener in
    prose that never closes does not hide the balanced object after it: the object is still
    reported, and so is the stray opener, as ``(start, len(text), False)`` (the first
    ``MAX_UNCLOSED`` of them) so a caller can tell a broken object from a stray brace.
    """
    openers_re = _opener_pattern(openers)
    stack: list[int] = []
    closed: list[tuple[int, int, bool]] = []  # maximal so far: a closing pair drops those inside it
    pos = 0
    n = len(text)
    while pos < n:
        m = (_STRUCTURAL if stack else openers_re).search(text, pos)
        if m is None:
            break
        ch = m.group()
        pos = m.end()
        if ch == '"':
            s = _STRING_REST.match(text, pos)
            if s is None:  # unterminated string: the rest of the text is inside it
                break
            pos = s.end()
        elif ch == "{" or ch == "[":
            stack.append(pos - 1)
        else:
            start = stack.pop()
            while closed and closed[-1][0] > start:
                closed.pop()
            closed.append((start, pos, True))
    if not stack:
        return closed
    unclosed = [(start, n, False) for start in stack[:MAX_UNCLOSED]]
    return sorted(closed + unclosed)


@functools.lru_cache(maxsize=8)
def _opener_pattern(openers: str) -> re.Pattern[str]:
    return re.compile("[" + re.escape(openers) + "]")


def span_end(text: str, start: int) -> int | None:
    """Index just past the bracket closing the one at ``start``, or None if it never closes."""
    depth = 0
    pos = start
    while True:
        m = _STRUCTURAL.search(text, pos)
        if m is None:
            return None
        ch = m.group()
        pos = m.end()
        if ch == '"':
            s = _STRING_REST.match(text, pos)
            if s is None:
                return None
            pos = s.end()
        elif ch in "{[":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return pos


def loads(text: str) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, error)``; never raises. Lone surrogate escapes are scrubbed."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "JSON is nested too deeply"
    except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
        return None, str(exc)
    if _SURROGATE_ESCAPE.search(text):
        value = scrub_json(value)
    return value, None


def json_type(value: Any) -> str:
    """How feedback names a decoded JSON value's type."""
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"
