"""The OpenAI API as the scripted server speaks it: a request's checks (400s that name the field), OpenAI-shaped
errors, ``n`` choices cut to ``max_tokens`` with ``top_logprobs``, and ``/v1/completions`` replies (text prompts)."""

from __future__ import annotations

import itertools
import json
import math
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

from rollout.models import scripted_tokens
from rollout.protocols import ModelResponse
from rollout.records import Message, Usage
from rollout.wire.chat import completion_json, error_body

PIECES = scripted_tokens._TOKEN
"""How the fake tokenizer splits text: one fake token per piece."""
ROLE_PREFIX = scripted_tokens.render_message({"role": "assistant"})
"""The rendered assistant message starts with these fake tokens, before its content."""
MAX_N, MAX_TOP_LOGPROBS = 128, 20
TEXT_MAX_TOKENS = 16
"""``/v1/completions`` answers at most 16 tokens unless told, as OpenAI's and vLLM's do."""


@dataclass
class Reply:
    """One answer: a JSON payload, or (``events``) the server-sent events of a streamed one."""

    status: int
    payload: dict[str, Any]
    headers: dict[str, str] | None = None
    events: list[dict[str, Any]] | None = None

    @property
    def media_type(self) -> str:
        return "application/json" if self.events is None else "text/event-stream"

    def chunks(self) -> Iterator[bytes]:
        """The body in the pieces it is written in (json.dumps escapes lone surrogates, as broken servers do)."""
        if self.events is None:
            yield json.dumps(self.payload).encode()
            return
        for event in self.events:
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


class Invalid(ValueError):
    """A request OpenAI refuses with 400; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param, self.code = param, code

    def reply(self) -> Reply:
        return Reply(400, error_body(str(self), 400, kind="invalid_request_error", code=self.code, param=self.param))


@dataclass
class ApiRequest:
    kind: str
    """``chat`` (``/v1/chat/completions``) or ``text`` (``/v1/completions``)."""
    body: dict[str, Any]
    prompts: list[list[Message]]
    """The conversations to answer: a chat request's messages, or one user message per text prompt."""
    n: int = 1
    max_tokens: int | None = None
    logprobs: int | None = None
    """None: no logprobs; else how many alternatives each token's ``top_logprobs`` lists."""
    stream: bool = False
    include_usage: bool = False


def parse_request(raw: bytes, kind: str) -> ApiRequest:
    """The request's fields, checked as OpenAI checks them; anything else a client may send is ignored."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise Invalid("We could not parse the JSON body of your request: it is not JSON.", None,
                      "invalid_json") from None
    if not isinstance(body, dict):
        raise Invalid(f"The request body must be a JSON object, but got {_a(body)} instead.", None, "invalid_type")
    req = ApiRequest(kind, body, _prompts(body, kind), n=_int(body, "n", 1, 1, MAX_N))
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    req.max_tokens = _int(body, limit, TEXT_MAX_TOKENS if kind == "text" else None, 1)
    if kind == "chat":
        top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
        if top and not _bool(body, "logprobs"):
            raise Invalid("Invalid value for 'top_logprobs': 'logprobs' must be true to use it.", "top_logprobs")
        req.logprobs = top if _bool(body, "logprobs") else None
    else:
        req.logprobs = _int(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    req.stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise Invalid(f"Invalid type for 'stream_options': expected an object, but got {_a(options)} instead.",
                      "stream_options", "invalid_type")
    req.include_usage = _bool(options or {}, "include_usage", "stream_options.include_usage")
    return req


def _prompts(body: dict[str, Any], kind: str) -> list[list[Message]]:
    name = "messages" if kind == "chat" else "prompt"
    if body.get(name) is None:
        raise Invalid(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
    value = body[name]
    if kind == "chat":
        if not isinstance(value, list):
            raise Invalid(f"Invalid type for 'messages': expected an array of objects, but got {_a(value)} instead.",
                          "messages", "invalid_type")
        for i, message in enumerate(value):
            if not isinstance(message, dict):
                raise Invalid(f"Invalid type for 'messages[{i}]': expected an object, but got {_a(message)} instead.",
                              f"messages[{i}]", "invalid_type")
        return [value]
    prompts = [value] if isinstance(value, str) else value
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise Invalid("Invalid value for 'prompt': this server reads text prompts (a string or an array of strings); "
                      "its fake token ids cannot be decoded back into text.", "prompt")
    return [[{"role": "user", "content": p}] for p in prompts]


def _a(value: Any) -> str:
    """The JSON type of ``value``, with its article."""
    if isinstance(value, bool):
        return "a boolean"
    names = {str: "a string", int: "an integer", float: "a number", list: "an array", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _int(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"Invalid type for '{name}': expected an integer, but got {_a(value)} instead.", name,
                      "invalid_type")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise Invalid(f"Invalid value for '{name}': expected an integer {bound}, but got {value} instead.", name,
                      "integer_below_min_value" if value < low else "integer_above_max_value")
    return value


def _bool(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise Invalid(f"Invalid type for '{param or name}': expected a boolean, but got {_a(value)} instead.",
                      param or name, "invalid_type")
    return bool(value)


def alternatives(token: int, logprob: float, k: int) -> list[tuple[int, float]]:
    """``k`` deterministic (token, logprob) pairs, most likely first: the sampled token and k-1 others that share
    the rest of the probability mass by halves."""
    rest = math.log(max(1e-6, -math.expm1(logprob)))  # log(1 - p)
    others = [(100 + zlib.crc32(f"{token}:{j}".encode()) % (scripted_tokens.VOCAB_SIZE - 100),
               round(rest - j * math.log(2), 3)) for j in range(1, k)]
    return sorted([(token, logprob), *others], key=lambda pair: -pair[1])[:k]


def cut(response: ModelResponse, limit: int | None) -> ModelResponse:
    """The reply of an engine that stopped after ``limit`` tokens: its text so far, no tool calls, ``length``."""
    ids = response.completion_token_ids
    if limit is None or (ids is not None and len(ids) <= limit):
        return response
    pieces = PIECES.findall(scripted_tokens.render_message(response.message))
    if len(pieces) <= limit:
        return response
    text = "".join(pieces[:limit])
    prompt, logprobs = response.usage.prompt_tokens, response.logprobs
    return response.model_copy(update={
        "message": {"role": "assistant", "content": text[len(ROLE_PREFIX):] if text.startswith(ROLE_PREFIX) else ""},
        "finish_reason": "length",
        "usage": Usage(prompt_tokens=prompt, completion_tokens=limit, total_tokens=prompt + limit),
        "completion_token_ids": None if ids is None else ids[:limit],
        "logprobs": None if logprobs is None else logprobs[:limit],
    })


def chat_reply(req: ApiRequest, responses: list[ModelResponse], completion_id: str, model: str) -> dict[str, Any]:
    """A chat.completion with one choice per response."""
    wants = {"logprobs": req.logprobs is not None, "return_token_ids": bool(req.body.get("return_token_ids"))}
    replies = [completion_json(cut(response, req.max_tokens), wants, completion_id, model) for response in responses]
    out = replies[0]
    out["choices"] = [reply["choices"][0] | {"index": i} for i, reply in enumerate(replies)]
    for choice in out["choices"]:
        for entry in (choice["logprobs"] or {}).get("content") or []:
            entry["top_logprobs"] = [{"token": str(t), "logprob": lp, "bytes": None}
                                     for t, lp in alternatives(int(entry["token"]), entry["logprob"], req.logprobs)]
    out["usage"] = _usage(req, [reply["usage"] for reply in replies])
    return out


def completion_text(message: Message) -> str:
    """An assistant message as a raw completion: its text, then each tool call as a hermes ``<tool_call>`` block."""
    parts = [message["content"]] if isinstance(message.get("content"), str) and message["content"] else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = fn.get("arguments")
        parts.append(f"<tool_call>\n{json.dumps({'name': fn.get('name'), 'arguments': arguments})}\n</tool_call>")
    return "\n".join(parts)


def text_reply(req: ApiRequest, responses: list[ModelResponse], completion_id: str, model: str) -> dict[str, Any]:
    """A text_completion with one choice per response (``n`` per prompt, prompt by prompt)."""
    choices, usages = [], []
    for i, response in enumerate(responses):
        pieces = PIECES.findall(completion_text(response.message))
        finish = "length" if req.max_tokens is not None and len(pieces) > req.max_tokens else "stop"
        pieces = pieces[:req.max_tokens]
        text = "".join(pieces)
        ids, logprobs = scripted_tokens.token_ids(text), scripted_tokens.logprobs(text)
        prompt_ids = scripted_tokens.token_ids(req.prompts[i // req.n][0]["content"])
        choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
        if req.logprobs is not None:
            top = [dict((p if t == token else str(t), x) for t, x in alternatives(token, lp, req.logprobs))
                   for p, token, lp in zip(pieces, ids, logprobs)]
            offsets = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0)) if pieces else []
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": logprobs,
                                  "top_logprobs": top if req.logprobs else None, "text_offset": offsets}
        if req.body.get("return_token_ids"):
            choice.update(prompt_token_ids=prompt_ids, token_ids=ids)
        choices.append(choice)
        usages.append({"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)})
    return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": _usage(req, usages)}


def _usage(req: ApiRequest, usages: list[dict[str, Any]]) -> dict[str, int]:
    """One prompt's tokens counted once however many completions it has; every completion's tokens counted."""
    prompt = sum(u["prompt_tokens"] for u in usages[::req.n])
    completion = sum(u["completion_tokens"] for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
