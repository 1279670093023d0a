"""A finished chat.completion or text_completion as the server-sent events of ``stream: true``, in OpenAI's chunk
format: the role first, a chunk per fake token of content, tool-call deltas (index, id, name, then the arguments),
the finish, and a usage chunk on ``stream_options.include_usage``. A chunk carries the logprobs and vLLM's token
ids of its tokens, so that the chunks' token data concatenates to the unstreamed reply's."""

from __future__ import annotations

import json
from typing import Any

from cluster.serving.scripted_server.api import PIECES

REST = 1 << 30
"""Take every token left (the finish chunk's: none, unless a fault added text)."""


def chat_events(reply: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    base = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": reply["model"],
            "system_fingerprint": None}
    if include_usage:
        base["usage"] = None  # OpenAI's chunks say so until the usage chunk
    events = [event for choice in reply["choices"] for event in _chat_choice(choice, base)]
    if "prompt_token_ids" in reply:
        events[0]["prompt_token_ids"] = reply["prompt_token_ids"]
    if include_usage:
        events.append({**base, "choices": [], "usage": reply["usage"]})
    return events


def _chat_choice(choice: dict[str, Any], base: dict[str, Any]) -> list[dict[str, Any]]:
    message, index = choice["message"], choice["index"]
    entries = (choice.get("logprobs") or {}).get("content")
    ids, taken = choice.get("token_ids"), 0

    def chunk(delta: dict[str, Any], n: int, finish: str | None = None) -> dict[str, Any]:
        nonlocal taken
        one: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if entries and entries[taken: taken + n]:
            one["logprobs"] = {"content": entries[taken: taken + n]}
        if ids is not None:
            one["token_ids"] = ids[taken: taken + n]
        taken += n
        return {**base, "choices": [one]}

    out = [chunk({"role": "assistant", "content": ""}, 0)]  # the header is the prompt's, not the reply's
    if isinstance(message.get("content"), str):
        out += [chunk({"content": piece}, 1) for piece in PIECES.findall(message["content"])]
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        rendered = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, sort_keys=True)  # as scripted_tokens
        head = {"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [head]}, len(PIECES.findall(rendered))))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}, 0)
                for part in PIECES.findall(fn["arguments"])]
    out.append(chunk({}, REST, choice["finish_reason"]))
    return out


def text_events(reply: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    base = {"id": reply["id"], "object": "text_completion", "created": reply["created"], "model": reply["model"]}
    if include_usage:
        base["usage"] = None
    events = []
    for choice in reply["choices"]:
        logprobs, ids = choice.get("logprobs"), choice.get("token_ids")
        pieces = PIECES.findall(choice["text"])
        for j, piece in enumerate(pieces):
            one: dict[str, Any] = {"index": choice["index"], "text": piece, "logprobs": None, "finish_reason": None}
            if logprobs is not None:
                one["logprobs"] = {key: None if value is None else value[j: j + 1] for key, value in logprobs.items()}
            if ids is not None:
                one["token_ids"] = ids[j: j + 1]
            events.append({**base, "choices": [one]})
        end: dict[str, Any] = {"index": choice["index"], "text": "", "logprobs": None,
                               "finish_reason": choice["finish_reason"]}
        if ids is not None:
            end["token_ids"] = ids[len(pieces):]
        events.append({**base, "choices": [end]})
        if "prompt_token_ids" in choice:
            events[-len(pieces) - 1]["choices"][0]["prompt_token_ids"] = choice["prompt_token_ids"]
    if include_usage:
        events.append({**base, "choices": [], "usage": reply["usage"]})
    return events
