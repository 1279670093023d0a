"""What the model gateway (``engine``) answers with, whatever serves it: a ``Reply`` (status, body, media type),
upstream bodies read leniently, JSON replies, OpenAI-shaped errors, and a full chat completion as the server-sent
events of ``stream: true`` (the whole message in one chunk, then the finish, then the usage when asked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import orjson

from rollout.wire.chat import error_body, loads_lenient


def decode_reply(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except ValueError:
        try:
            return loads_lenient(raw)  # broken text in the model's reply is still the model's reply
        except ValueError:
            return None


@dataclass(frozen=True)
class Reply:
    """An answer of the gateway, for the HTTP server in front of it (FastAPI, a unix socket's aiohttp) to send."""

    status: int
    body: bytes
    media_type: str = "application/json"


def json_reply(payload: Any, status: int) -> Reply:
    return Reply(status, orjson.dumps(payload))


def error_reply(message: str, status: int, kind: str | None = None) -> Reply:
    return json_reply(error_body(message, status, kind=kind), status)


def error_message(reply: Reply) -> str:
    return orjson.loads(reply.body)["error"]["message"]


def as_events(data: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """A full chat completion as the chunks a streaming server sends: the whole message, then the finish."""
    base = {"id": data.get("id"), "object": "chat.completion.chunk", "created": data.get("created"),
            "model": data.get("model")}
    first = {"prompt_token_ids": data["prompt_token_ids"]} if "prompt_token_ids" in data else {}
    for choice in data.get("choices") or []:
        message, index = dict(choice.get("message") or {}), choice.get("index", 0)
        message["role"] = "assistant"
        if message.get("tool_calls"):
            message["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        delta = {"index": index, "delta": message, "logprobs": choice.get("logprobs"), "finish_reason": None}
        if "token_ids" in choice:
            delta["token_ids"] = choice["token_ids"]
        yield b"data: " + orjson.dumps({**base, **first, "choices": [delta]}) + b"\n\n"
        first = {}
        end = {"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.get("finish_reason")}
        yield b"data: " + orjson.dumps({**base, "choices": [end]}) + b"\n\n"
    if include_usage:
        yield b"data: " + orjson.dumps({**base, "choices": [], "usage": data.get("usage")}) + b"\n\n"
    yield b"data: [DONE]\n\n"
