"""vLLM's token-in, token-out route, ``POST /inference/v1/generate``, both ways, as plain dicts: the body a client
sends, the reply a server answers, and the reply read back. The shape is vLLM 0.32's (``GenerateRequest`` and
``GenerateResponse`` in ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``):

- request: ``{"model", "token_ids": [int], "sampling_params": {max_tokens, temperature, top_p, seed, logprobs,
  stop_token_ids, ...}, "return_token_ids"?, "output_mode"?: "tokens" | "text", "stream"?, "cache_salt"?,
  "request_id"?}``; this farm adds ``metadata`` (the rollout identity), which vLLM ignores;
- reply: ``{"request_id", "model", "created", "usage", "prompt_token_ids"? (with ``return_token_ids``),
  "choices": [{"index", "token_ids", "finish_reason", "stop_reason", "logprobs": {"content": [...]},
  "weight_versions": [{"version", "start", "end"}], "text"? (``output_mode: text``)}]}``.

A logprob entry in ``tokens`` mode carries the integer ``token_id`` (vLLM 0.32) and also the ``"token_id:N"``
placeholder as ``token``, which earlier vLLM releases sent and clients written against them (the ``renderers``
package that verifiers' training client uses) check; in ``text`` mode ``token`` is the token's text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

GENERATE_PATH = "/inference/v1/generate"
INITIAL_WEIGHT_VERSION = "default"
"""The version a vLLM engine reports until it is told one (``update_weight_version``): no version of ours."""
TOP_LEVEL = frozenset({"model", "metadata", "cache_salt", "priority", "request_id"})
"""Fields of an OpenAI completions body that stay at the top of a generate body; the sampling ones move into
``sampling_params`` and the rest (prompt, stream, echo, ...) are not generate's."""
NOT_SAMPLING = frozenset({"prompt", "messages", "tools", "tool_choice", "stream", "stream_options", "echo",
                          "suffix", "user", "return_token_ids", "response_format", "store"})


def placeholder(token_id: int) -> str:
    """vLLM's text for a token it does not decode."""
    return f"token_id:{token_id}"


def generate_body(prompt_ids: list[int], completions_body: Mapping[str, Any], *,
                  output_mode: str = "text") -> dict[str, Any]:
    """The generate body for what a ``/v1/completions`` body with a token-id prompt asks: the same model,
    identity, cache salt and sampling (``logprobs: k`` keeps its meaning: the sampled token's logprob plus k-1
    alternatives)."""
    body: dict[str, Any] = {"token_ids": list(prompt_ids), "return_token_ids": True, "output_mode": output_mode}
    sampling: dict[str, Any] = {}
    for key, value in completions_body.items():
        if key in TOP_LEVEL:
            body[key] = value
        elif key not in NOT_SAMPLING and value is not None:
            sampling[key] = value
    body["sampling_params"] = sampling
    return body


def logprob_entry(token_id: int, logprob: float, top: list[tuple[int, float]] | None = None) -> dict[str, Any]:
    """One sampled token's logprob in ``tokens`` mode, its alternatives (the sampled token first) in ``top``."""
    return {"token_id": token_id, "token": placeholder(token_id), "logprob": logprob, "rank": None,
            "top_logprobs": [{"token_id": t, "token": placeholder(t), "logprob": lp, "rank": None}
                             for t, lp in top or []]}


def with_placeholders(reply: dict[str, Any]) -> dict[str, Any]:
    """A vLLM 0.32 reply whose ``tokens``-mode logprob entries also carry the ``"token_id:N"`` placeholder as
    ``token`` (clients written against earlier releases check it); other entries are left as they are."""
    for choice in reply.get("choices") or []:
        for entry in (choice.get("logprobs") or {}).get("content") or []:
            for item in [entry, *(entry.get("top_logprobs") or [])]:
                if isinstance(item, dict) and "token_id" in item and "token" not in item:
                    item["token"] = placeholder(item["token_id"])
    return reply


def weight_spans(version: str | None, n: int) -> list[dict[str, Any]]:
    """The ``weight_versions`` of a completion of ``n`` tokens sampled under one version."""
    return [{"version": version or INITIAL_WEIGHT_VERSION, "start": 0, "end": n}]


@dataclass
class Generated:
    """One choice of a generate reply, read back."""

    prompt_ids: list[int] | None
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    text: str | None
    """The completion's text (``output_mode: text``), else None."""
    weight_version: str | None
    """The version of the weights that sampled the last token; None when the engine reports none of ours."""
    model: str


def parse_generate(data: Mapping[str, Any]) -> Generated:
    """The first choice of a generate reply (``KeyError``/``TypeError``/``ValueError`` when it is malformed)."""
    choice = data["choices"][0]
    entries = (choice.get("logprobs") or {}).get("content") or []
    spans = sorted(choice.get("weight_versions") or [], key=lambda span: span.get("start", 0))
    version = spans[0]["version"] if spans else None  # a turn's oldest tokens set its age (staleness is an upper bound)
    return Generated(
        prompt_ids=None if data.get("prompt_token_ids") is None else list(data["prompt_token_ids"]),
        completion_ids=[int(t) for t in choice["token_ids"]],
        logprobs=[float(entry["logprob"]) for entry in entries],
        finish_reason=choice.get("finish_reason"),
        text=choice.get("text"),
        weight_version=None if version in (None, INITIAL_WEIGHT_VERSION) else str(version),
        model=data.get("model") or "",
    )
