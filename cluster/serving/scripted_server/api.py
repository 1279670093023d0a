"""The OpenAI API's replies as the scripted server writes them: ``n`` choices cut to ``max_tokens``, logprobs with
each token's text (and its id as ``token_id``) and ``top_logprobs``, and ``/v1/completions`` replies. A request's
checks are in ``checks``."""

from __future__ import annotations

import itertools
import json
import math
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

from cluster.serving.scripted_server.checks import ApiRequest
from rollout.models import scripted_tokens
from rollout.protocols import ModelResponse
from rollout.records import Message, Usage
from rollout.wire.chat import completion_json

PIECES = scripted_tokens._TOKEN
"""How the fake tokenizer splits text: one fake token per piece."""


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


def alternatives(token: int, logprob: float, k: int) -> list[tuple[int, float]]:
    """``k`` deterministic (token, logprob) pairs, most likely first: the sampled token and k-1 others that share
    the rest of the probability mass by halves."""
    rest = math.log(max(1e-6, -math.expm1(logprob)))  # log(1 - p)
    others = [(100 + zlib.crc32(f"{token}:{j}".encode()) % (scripted_tokens.VOCAB_SIZE - 100),
               round(rest - j * math.log(2), 3)) for j in range(1, k)]
    return sorted([(token, logprob), *others], key=lambda pair: -pair[1])[:k]


def cut(response: ModelResponse, limit: int | None) -> ModelResponse:
    """The reply of an engine that stopped after ``limit`` tokens: the text of those tokens, no tool calls,
    ``length``."""
    ids = response.completion_token_ids
    if limit is None or (ids is not None and len(ids) <= limit):
        return response
    pieces = PIECES.findall(scripted_tokens.render_reply(response.message))
    if len(pieces) <= limit:
        return response
    prompt, logprobs = response.usage.prompt_tokens, response.logprobs
    return response.model_copy(update={
        "message": {"role": "assistant", "content": "".join(pieces[:limit])},
        "finish_reason": "length",
        "usage": Usage(prompt_tokens=prompt, completion_tokens=limit, total_tokens=prompt + limit),
        "completion_token_ids": None if ids is None else ids[:limit],
        "logprobs": None if logprobs is None else logprobs[:limit],
    })


def chat_reply(req: ApiRequest, responses: list[ModelResponse], completion_id: str, model: str) -> dict[str, Any]:
    """A chat.completion with one choice per response."""
    wants = {"logprobs": req.logprobs is not None, "return_token_ids": bool(req.body.get("return_token_ids"))}
    text = scripted_tokens.token_text
    replies = [completion_json(cut(response, req.max_tokens), wants, completion_id, model, text)
               for response in responses]
    out = replies[0]
    out["choices"] = [reply["choices"][0] | {"index": i} for i, reply in enumerate(replies)]
    for choice in out["choices"]:
        for entry in (choice["logprobs"] or {}).get("content") or []:
            entry["top_logprobs"] = [
                {"token": text(t), "logprob": lp, "bytes": list(text(t).encode()), "token_id": t}
                for t, lp in alternatives(entry["token_id"], entry["logprob"], req.logprobs)]
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


def raw_completion(message: Message, limit: int | None) -> tuple[list[str], str]:
    """The pieces (fake tokens) of ``message`` as a raw completion cut to ``limit``, and its finish reason."""
    pieces = PIECES.findall(completion_text(message))
    finish = "length" if limit is not None and len(pieces) > limit else "stop"
    return pieces[:limit], finish


def text_reply(req: ApiRequest, responses: list[ModelResponse], completion_id: str, model: str) -> dict[str, Any]:
    """A text_completion with one choice per response (``n`` per prompt, prompt by prompt)."""
    choices, usages, text_of = [], [], scripted_tokens.token_text
    for i, response in enumerate(responses):
        pieces, finish = raw_completion(response.message, req.max_tokens)
        text = "".join(pieces)
        ids, logprobs = scripted_tokens.token_ids(text), scripted_tokens.logprobs(text)
        prompt_ids = req.prompt_ids[i // req.n]
        choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
        if req.logprobs is not None:
            # one map per token, keyed by each alternative's text (the sampled token's among them)
            top = [{text_of(t): x for t, x in alternatives(token, lp, req.logprobs)}
                   for token, lp in zip(ids, logprobs)]
            offsets = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0)) if pieces else []
            choice["logprobs"] = {"tokens": [text_of(t) for t in ids], "token_logprobs": logprobs,
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
