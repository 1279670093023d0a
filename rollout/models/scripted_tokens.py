"""Deterministic fake token ids and logprobs, so code that handles token data runs without an engine.

The same text always gives the same ids; a conversation's ids are the concatenation of its messages' ids, so an
append-only conversation keeps a stable prefix, as with a real engine. The fake chat template renders a message as
``<|role|>`` + its content (+ its tool calls as JSON); a prompt ends with the generation prompt ``<|assistant|>``,
and a reply is the rest of the assistant message, so prompt + reply ids are the conversation's ids with the reply.

Ids come from hashing text pieces, so they cannot be decoded by arithmetic: ``decode`` reads them back through the
pieces this process has tokenized (a fake server decodes what its clients rendered through it, and its own
replies); the role headers are always known.
"""

from __future__ import annotations

import json
import re
import zlib
from functools import lru_cache
from typing import Any

VOCAB_SIZE = 2**31 - 1
"""Ids of a 32-bit vocabulary: a 50,000-id one gave two of a few hundred pieces the same id (the birthday bound),
so a reply decoded with another piece's text."""
_TOKEN = re.compile(r"\w+|[^\w\s]|\s+")
ROLES = ("system", "user", "assistant", "tool")
GENERATION_PROMPT = "<|assistant|>"
"""What the fake template puts after the conversation for the model to answer (the assistant's header)."""
_HEADER = re.compile(r"<\|(" + "|".join(ROLES) + r")\|>")
UNKNOWN = "\ufffd"
"""The text of an id no piece in this process gave (what a detokenizer writes for bytes it cannot decode)."""
_PIECES: dict[int, str] = {}
"""id -> the piece this process last gave it."""


def _h(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8", "replace"))


def token_ids(text: str) -> list[int]:
    return list(_token_ids(text))


@lru_cache(maxsize=8192)
def _token_ids(text: str) -> tuple[int, ...]:
    # Cached: a conversation is re-sent every turn, and system/instance prompts repeat across rollouts.
    pieces = _TOKEN.findall(text)
    ids = tuple(100 + _h(piece) % (VOCAB_SIZE - 100) for piece in pieces)
    _PIECES.update(zip(ids, pieces))
    return ids


def logprobs(text: str) -> list[float]:
    """One negative logprob per token in (-3, 0], derived from the token and its position."""
    return list(_logprobs(text))


@lru_cache(maxsize=8192)
def _logprobs(text: str) -> tuple[float, ...]:
    return tuple(-round(((_h(f"{i}:{p}") % 3000) / 1000.0), 3) for i, p in enumerate(_TOKEN.findall(text)))


def render_message(message: dict[str, Any]) -> str:
    """A flat text of one message: what a chat template would feed the tokenizer."""
    return f"<|{message.get('role', '')}|>" + render_reply(message)


def render_reply(message: dict[str, Any]) -> str:
    """A message without its header: for an assistant message, what the model generated after the prompt."""
    parts = []
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content:
        parts.append(str(content))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        parts.append(json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}, sort_keys=True))
    return "".join(parts)


def prompt_token_ids(messages: list[dict[str, Any]], generation_prompt: bool = True) -> list[int]:
    """The conversation's ids, then (``generation_prompt``) the assistant's header the reply follows."""
    out: list[int] = []
    for message in messages:
        out.extend(_token_ids(render_message(message)))
    if generation_prompt:
        out.extend(_token_ids(GENERATION_PROMPT))
    return out


def token_text(token_id: int) -> str:
    """The piece ``token_id`` stands for, or a stand-in of its own (``<|id|>``) when this process never made it."""
    _known_headers()
    return _PIECES.get(token_id) or f"<|{token_id}|>"


def decode(ids: list[int]) -> str:
    """The text of ``ids`` as far as this process knows their pieces (``UNKNOWN`` for the others)."""
    _known_headers()
    return "".join(_PIECES.get(i, UNKNOWN) for i in ids)


def _known_headers() -> None:
    if not _PIECES:
        for role in ROLES:
            _token_ids(f"<|{role}|>")


def messages_of(text: str) -> list[dict[str, Any]]:
    """The conversation a fake-template rendering shows (its trailing generation prompt left out); text without
    headers is one user message."""
    parts = _HEADER.split(text)
    if len(parts) == 1:
        return [{"role": "user", "content": text}]
    out = [{"role": "user", "content": parts[0]}] if parts[0] else []
    out += [{"role": role, "content": content} for role, content in zip(parts[1::2], parts[2::2])]
    if len(out) > 1 and out[-1] == {"role": "assistant", "content": ""}:
        out.pop()
    return out
