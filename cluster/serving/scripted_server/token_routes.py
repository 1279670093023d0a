"""The scripted server's token-id routes: ``POST /inference/v1/generate`` (vLLM's token-in, token-out route, in the
shape of ``rollout.wire.generate``) and ``POST /tokenize`` (vLLM's: a conversation or a text as fake ids).

A generate prompt's fake ids are read back into the conversation they render (``scripted_tokens.messages_of``),
the policy answers it, and its reply is a raw completion (text, then hermes tool calls) in fake ids with their
logprobs, and the weight version the request carries (``metadata.policy_version``; vLLM's ``default`` without
one)."""

from __future__ import annotations

import time
from typing import Any

from cluster.serving.scripted_server.api import alternatives, raw_completion
from cluster.serving.scripted_server.checks import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    ApiRequest,
    Invalid,
    a,
    boolean,
    check_sampling,
    integer,
    load_object,
    token_list,
)
from rollout.models import scripted_tokens
from rollout.protocols import ModelResponse
from rollout.wire.generate import logprob_entry, weight_spans

OUTPUT_MODES = ("tokens", "text")


def parse_generate(raw: bytes) -> ApiRequest:
    """A generate body checked as vLLM checks it (400s naming the field); ``body`` gets the sampling fields the
    rest of the server reads at its top (``seed``, ``max_tokens``)."""
    body = load_object(raw)
    ids = body.get("token_ids")
    if not token_list(ids):
        code = "missing_required_parameter" if ids is None else "invalid_type"
        raise Invalid(f"Invalid value for 'token_ids': expected a non-empty array of non-negative integers, but got "
                      f"{a(ids)} instead.", "token_ids", code)
    sampling = body.get("sampling_params")
    if not isinstance(sampling, dict):
        raise Invalid(f"Invalid type for 'sampling_params': expected an object, but got {a(sampling)} instead.",
                      "sampling_params", "invalid_type")
    if body.get("output_mode", "tokens") not in OUTPUT_MODES:
        raise Invalid(f"Invalid value for 'output_mode': expected one of {', '.join(OUTPUT_MODES)}.", "output_mode")
    check_sampling(sampling, "sampling_params.")
    n = integer(sampling, "n", 1, 1, MAX_N, "sampling_params.n")
    req = ApiRequest("generate", {**body, "seed": sampling.get("seed"), "max_tokens": sampling.get("max_tokens")},
                     [scripted_tokens.messages_of(scripted_tokens.decode(ids))], [list(ids)], n=n)
    req.max_tokens = integer(sampling, "max_tokens", None, 1, param="sampling_params.max_tokens")
    req.logprobs = integer(sampling, "logprobs", None, 0, MAX_TOP_LOGPROBS, "sampling_params.logprobs")
    req.stream = boolean(body, "stream")
    boolean(body, "return_token_ids")
    req.include_usage = boolean(body.get("stream_options") or {}, "include_usage", "stream_options.include_usage")
    return req


def generate_reply(req: ApiRequest, responses: list[ModelResponse], request_id: str, model: str,
                   version: str | None) -> dict[str, Any]:
    """vLLM's generate reply: one choice per response."""
    text_mode = req.body.get("output_mode") == "text"
    choices, completion = [], 0
    for i, response in enumerate(responses):
        pieces, finish = raw_completion(response.message, req.max_tokens)
        text = "".join(pieces)
        ids, logprobs = scripted_tokens.token_ids(text), scripted_tokens.logprobs(text)
        choice: dict[str, Any] = {"index": i, "finish_reason": finish, "stop_reason": None, "token_ids": ids,
                                  "logprobs": None, "weight_versions": weight_spans(version, len(ids))}
        if req.logprobs is not None:
            k = max(req.logprobs, 1)
            choice["logprobs"] = {"content": [_entry(t, lp, k, text_mode) for t, lp in zip(ids, logprobs)]}
        if text_mode:
            choice["text"] = text
        choices.append(choice)
        completion += len(ids)
    prompt = len(req.prompt_ids[0])
    return {"request_id": request_id, "model": model, "created": int(time.time()),
            "output_mode": "text" if text_mode else "tokens",
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            "prompt_token_ids": req.prompt_ids[0] if req.body.get("return_token_ids") else None, "choices": choices}


def _entry(token: int, logprob: float, k: int, text_mode: bool) -> dict[str, Any]:
    """The sampled token first, then the other alternatives most likely first (vLLM's order)."""
    top = [(token, logprob)] + [pair for pair in alternatives(token, logprob, k) if pair[0] != token][: k - 1]
    if not text_mode:
        return logprob_entry(token, logprob, top)
    text = scripted_tokens.token_text

    def item(t: int, lp: float) -> dict[str, Any]:
        return {"token": text(t), "logprob": lp, "bytes": list(text(t).encode("utf-8", "replace"))}

    return {**item(token, logprob), "top_logprobs": [item(t, lp) for t, lp in top]}


def generate_events(reply: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The reply as vLLM streams it: a chunk per token, then one with the finish reason and weight versions; the
    prompt's ids on the first chunk, the usage last when asked."""
    base = {"request_id": reply["request_id"], "output_mode": reply["output_mode"]}
    events = []
    for choice in reply["choices"]:
        entries = (choice["logprobs"] or {}).get("content")
        for j, token in enumerate(choice["token_ids"]):
            one: dict[str, Any] = {"index": choice["index"], "finish_reason": None, "token_ids": [token],
                                   "logprobs": {"content": [entries[j]]} if entries else None}
            if "text" in choice:
                one["text"] = scripted_tokens.token_text(token)
            events.append({**base, "choices": [one]})
        end = {"index": choice["index"], "finish_reason": choice["finish_reason"], "stop_reason": None,
               "token_ids": [], "logprobs": None, "weight_versions": choice["weight_versions"]}
        if "text" in choice:
            end["text"] = ""
        events.append({**base, "choices": [end]})
    if reply["prompt_token_ids"] is not None:
        events[0]["prompt_token_ids"] = reply["prompt_token_ids"]
    if include_usage:
        events.append({**base, "choices": [], "usage": reply["usage"]})
    return events


def tokenize_reply(raw: bytes) -> dict[str, Any]:
    """vLLM's ``/tokenize``: ``messages`` (with ``add_generation_prompt``, default true) through the fake chat
    template, or ``prompt`` as text."""
    body = load_object(raw)
    if isinstance(body.get("messages"), list):
        if not all(isinstance(m, dict) for m in body["messages"]):
            raise Invalid("Invalid type for 'messages': expected an array of objects.", "messages", "invalid_type")
        generation = body.get("add_generation_prompt", True)
        ids = scripted_tokens.prompt_token_ids(body["messages"], generation_prompt=generation is not False)
    elif isinstance(body.get("prompt"), str):
        ids = scripted_tokens.token_ids(body["prompt"])
    else:
        raise Invalid("Missing required parameter: 'messages' (an array of objects) or 'prompt' (a string).",
                      "messages", "missing_required_parameter")
    return {"count": len(ids), "max_model_len": None, "tokens": ids,
            "token_strs": [scripted_tokens.token_text(t) for t in ids]}
