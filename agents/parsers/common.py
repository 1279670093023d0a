"""Helpers every text parser shares: message text, unicode scrubbing, fenced blocks, config building.

Everything here is linear in the length of the text: scanning uses ``str.find`` and anchored
matches only, never a regex that can backtrack over the whole message.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel

from rollout.config.load import validate
from rollout.records import Message

C = TypeVar("C", bound=BaseModel)


def configure(config_cls: type[C], config: C | None, options: dict[str, Any]) -> C:
    """A parser's config from a config object and/or keyword options (options win).

    Bad options raise ``ConfigError`` naming the field, like every other config section.
    """
    data = config.model_dump(exclude_unset=True) if config is not None else {}
    data.update(options)
    return validate(config_cls, data, prefix="parser")


def scrub(text: str) -> str:
    """Replace lone surrogates with U+FFFD.

    A lone surrogate cannot be encoded as UTF-8, so one left in an action would crash the
    trajectory writer (and the shell) long after the parser returned.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def scrub_json(value: Any) -> Any:
    """``scrub`` every string (keys included) in a decoded JSON value; iterative, so depth is free."""
    if isinstance(value, str):
        return scrub(value)
    if not isinstance(value, (dict, list)):
        return value
    root: list[Any] = [value]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, value)]
    while stack:
        parent, key, node = stack.pop()
        if isinstance(node, dict):
            fresh: dict[Any, Any] = {}
            for k, v in node.items():
                fresh[scrub(k) if isinstance(k, str) else k] = v
            parent[key] = fresh
            stack.extend((fresh, k, v) for k, v in fresh.items() if isinstance(v, (dict, list, str)))
        elif isinstance(node, list):
            fresh_list = list(node)
            parent[key] = fresh_list
            stack.extend((fresh_list, i, v) for i, v in enumerate(fresh_list) if isinstance(v, (dict, list, str)))
        else:
            parent[key] = scrub(node)
    return root[0]


def content_text(message: Message) -> str:
    """The text of an assistant message's ``content``: None, a string, or a list of content parts.

    Text parts are joined with newlines so that line-based formats (ReAct) survive a split.
    ``tool_calls`` and ``reasoning_content`` are deliberately not looked at.
    """
    content = message.get("content") if isinstance(message, dict) else None
    if content is None:
        return ""
    if isinstance(content, str):
        return scrub(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif (
                isinstance(part, dict)
                and isinstance(part.get("text"), str)
                and part.get("type", "text") in ("text", "output_text")
            ):
                parts.append(part["text"])
        return scrub("\n".join(parts))
    return scrub(str(content))


def strip_thinking(text: str, open_tag: str = "<think>", close_tag: str = "</think>") -> str:
    """Drop ``<think>...</think>`` spans: reasoning often quotes example actions it does not mean.

    A close tag with no open tag (the server ate the opener) drops everything before it; an
    open tag that is never closed drops the rest of the text.
    """
    out: list[str] = []
    pos = 0
    first_close = text.find(close_tag)
    first_open = text.find(open_tag)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        pos = first_close + len(close_tag)
    while True:
        start = text.find(open_tag, pos)
        if start == -1:
            out.append(text[pos:])
            break
        out.append(text[pos:start])
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            break
        pos = end + len(close_tag)
    return "".join(out)


class FencedBlock(NamedTuple):
    """One markdown code fence: its language (lower-cased first word of the info line), body, and
    whether a closing fence was found."""

    language: str
    body: str
    closed: bool


def fenced_blocks(text: str, fence: str = "```") -> list[FencedBlock]:
    """Every fenced code block, in order. The opener is the fence plus an info line; the body runs
    to the next fence. Linear: each ``find`` starts where the previous one ended."""
    blocks: list[FencedBlock] = []
    pos = 0
    while True:
        start = text.find(fence, pos)
        if start == -1:
            return blocks
        eol = text.find("\n", start + len(fence))
        if eol == -1:  # an opener with nothing after it: an unclosed, empty block
            info = text[start + len(fence) :]
            blocks.append(FencedBlock(_language(info), "", False))
            return blocks
        info = text[start + len(fence) : eol]
        if fence in info:  # an inline ```like this``` span on one line, not a block
            pos = start + len(fence) + info.find(fence) + len(fence)
            continue
        end = text.find(fence, eol + 1)
        if end == -1:
            blocks.append(FencedBlock(_language(info), text[eol + 1 :], False))
            return blocks
        blocks.append(FencedBlock(_language(info), text[eol + 1 : end], True))
        pos = end + len(fence)


def _language(info: str) -> str:
    words = info.strip().split(None, 1)
    return words[0].lower() if words else ""


def unfence(text: str) -> str:
    """The body of a code fence wrapped around the whole text, or the text unchanged; stripped."""
    text = text.strip()
    if text.startswith("```"):
        eol = text.find("\n")
        text = text[eol + 1 :] if eol != -1 else text[3:]
        if text.rstrip().endswith("```"):
            text = text.rstrip()[:-3]
    return text.strip()


def snippet(text: str, limit: int = 80) -> str:
    """A short one-line excerpt for feedback messages."""
    text = " ".join(text.split()) if len(text) <= 4 * limit else " ".join(text[: 4 * limit].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
