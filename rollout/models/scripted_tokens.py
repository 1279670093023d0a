"""Deterministic fake token ids and logprobs, so code that handles token data runs without an engine.

The same text always gives the same ids; a conversation's ids are the concatenation of its
messages' ids, so an append-only conversation keeps a stable prefix, as with a real engine.
"""

from __future__ import annotations

import json
import re
import zlib
from functools import lru_cache
from typing import Any

VOCAB_SIZE = 50_000
_TOKEN = re.compile(r"\w+|[^\w\s]|\s+")


def _h(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8", "replace"))


def token_ids(text: str) -> list[int]:
    return list(_token_ids(text))


@lru_cache(maxsize=8192)
def _token_ids(text: str) -> tuple[int, ...]:
    # Cached: a conversation is re-sent every turn, and system/instance prompts repeat across rollouts.
    return tuple(100 + _h(piece) % (VOCAB_SIZE - 100) for piece in _TOKEN.findall(text))


def logprobs(text: str) -> list[float]:
    """One negative logprob per token in (-3, 0], derived from the token and its position."""
    return list(_logprobs(text))


@lru_cache(maxsize=8192)
def _logprobs(text: str) -> tuple[float, ...]:
    return tuple(-round(((_h(f"{i}:{p}") % 3000) / 1000.0), 3) for i, p in enumerate(_TOKEN.findall(text)))


def render_message(message: dict[str, Any]) -> str:
    """A flat text of one message: what a chat template would feed the tokenizer."""
    parts = [f"<|{message.get('role', '')}|>"]
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content:
        parts.append(str(content))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        parts.append(json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}, sort_keys=True))
    return "".join(parts)


def prompt_token_ids(messages: list[dict[str, Any]]) -> list[int]:
    out: list[int] = []
    for message in messages:
        out.extend(_token_ids(render_message(message)))
    return out
