"""The chat-completions wire format, both ways, shared by OpenAIModel and the scripted server: the
rollout identity in ``metadata``, replies (with vLLM's token ids), context-length rejections,
``Retry-After``, and the file-descriptor limit that thousands of sockets need."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any, Callable, Mapping

from rollout.context import clean_text

try:  # optional: a faster JSON codec for the request/response hot path
    import orjson as _orjson
except ImportError:  # pragma: no cover - the standard library does the same, slower
    _orjson = None
from rollout.protocols import ModelResponse
from rollout.records import Message, RequestMeta, Usage

CONTEXT_LENGTH_MARKERS = (
    "maximum context length",
    "context_length_exceeded",
    "prompt is too long",
    "exceeds the context window",
    "longer than the model's context length",
    "exceeds the maximum context length",
    "input is too long",
    "longer than the maximum model length",
    "too long to fit into the model",
)
"""Lower-case phrases by which vLLM, SGLang and hosted APIs say the prompt no longer fits. vLLM's OpenAI layer
says "maximum context length"; its input processor (token-id prompts, newer versions) says "... is longer than
the maximum model length of N" or "... is too long to fit into the model"."""

SESSION_HEADER = "x-session-id"
"""The header Ray Serve's proxy reads a request's session from (its ``RAY_SERVE_SESSION_ID_HEADER_KEY`` default);
the client sends the rollout id in it, so a session-aware router keeps a rollout on one replica."""
RELEASE_PREFIX = "release:"
"""A session id with this prefix ends the session after it (``cluster.serving.router``)."""

METADATA_FIELDS = ("rollout_id", "task_id", "sample_index", "attempt", "run_id", "policy_version")
"""The rollout identity as it travels in a request's ``metadata`` (all values strings)."""


def request_metadata(meta: RequestMeta) -> dict[str, str]:
    return {name: str(getattr(meta, name)) for name in METADATA_FIELDS if getattr(meta, name) is not None}


def meta_from_request(body: Mapping[str, Any], header_rollout_id: str = "") -> RequestMeta:
    """The identity a request carries: its ``metadata``, else the ``X-Rollout-Id`` header."""
    md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}

    def num(key: str, default: int) -> int:
        try:
            return int(md.get(key, default))
        except (TypeError, ValueError):
            return default

    return RequestMeta(
        rollout_id=str(md.get("rollout_id") or header_rollout_id),
        task_id=str(md.get("task_id") or ""),
        sample_index=num("sample_index", 0),
        attempt=num("attempt", 1),
        run_id=str(md.get("run_id") or ""),
        policy_version=str(md["policy_version"]) if md.get("policy_version") else None,
        seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
    )


def completion_json(response: ModelResponse, body: Mapping[str, Any], completion_id: str, model: str,
                    token_text: Callable[[int], str] | None = None) -> dict[str, Any]:
    """A chat.completion reply to ``body``, with logprobs and vLLM's token ids when it asks. A logprob entry's
    ``token`` is the token's text (``token_text``; vLLM's ``token_id:N`` without it) and ``token_id`` its id."""
    message = {"role": "assistant", "content": response.message.get("content")}
    if response.message.get("tool_calls"):
        message["tool_calls"] = response.message["tool_calls"]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": response.finish_reason, "logprobs": None}
    out = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": response.usage.model_dump(),
    }
    ids = response.completion_token_ids or []
    if body.get("logprobs"):
        pairs = zip(ids, response.logprobs or [])
        choice["logprobs"] = {"content": [logprob_json(t, lp, token_text) for t, lp in pairs]}
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = response.prompt_token_ids
        choice["token_ids"] = ids
    return out


def logprob_json(token_id: int, logprob: float, token_text: Callable[[int], str] | None = None) -> dict[str, Any]:
    """One token's entry in a chat reply's ``logprobs.content`` (OpenAI's fields, and vLLM-style ``token_id``)."""
    text = token_text(token_id) if token_text is not None else f"token_id:{token_id}"
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace")), "top_logprobs": [],
            "token_id": token_id}


def context_length_error(limit: int, prompt: int, completion: int) -> str:
    """The message vLLM sends with its context-length 400 (what the scripted server imitates)."""
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested {prompt + completion} "
        f"tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )


def parse_response(data: Mapping[str, Any], default_model: str = "") -> ModelResponse:
    """A chat.completion JSON (with vLLM's optional token-id fields) as a ModelResponse."""
    choice = data["choices"][0]
    raw = choice.get("message") or {}
    # Only role/content/tool_calls go back into the conversation: servers reject an empty
    # tool_calls list and fields like "refusal": null or "reasoning_content" on the way in.
    message: Message = {"role": raw.get("role") or "assistant", "content": raw.get("content")}
    if raw.get("tool_calls"):
        message["tool_calls"] = [_tool_call(call) for call in raw["tool_calls"]]
    usage = data.get("usage") or {}
    content_logprobs = (choice.get("logprobs") or {}).get("content")
    return ModelResponse(
        message=message,
        finish_reason=choice.get("finish_reason"),
        usage=Usage(**{k: usage.get(k) or 0 for k in ("prompt_tokens", "completion_tokens", "total_tokens")}),
        prompt_token_ids=data.get("prompt_token_ids"),
        completion_token_ids=choice.get("token_ids"),
        logprobs=None if content_logprobs is None else [float(item["logprob"]) for item in content_logprobs],
        model=data.get("model") or default_model,
    )


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {
        "id": call.get("id") or "",
        "type": call.get("type") or "function",
        "function": {"name": fn.get("name") or "", "arguments": fn.get("arguments") or "{}"},
    }


def loads_lenient(raw: bytes) -> Any:
    """A reply body that a strict decoder (orjson) refused, read the way a lenient one can: invalid UTF-8 and
    lone surrogate escapes (``"\\ud800"``, what a server's JSON encoder writes for broken text) become U+FFFD.
    They are in the model's text, so they are the model's reply, not an outage: the agent's parser judges
    it, and feeds a format error back when no action is left in it. ``ValueError`` if it is not JSON at all."""
    return clean_text(json.loads(raw.decode("utf-8", errors="replace")))


def is_context_length_error(body: str) -> bool:
    text = body.lower()
    return any(marker in text for marker in CONTEXT_LENGTH_MARKERS)


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: either delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def raise_open_file_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit: thousands of sockets need thousands of fds."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # some systems refuse RLIM_INFINITY; the soft limit stays as it was


def snippet(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def dumps_body(body: Any) -> bytes:
    if _orjson is not None:
        try:
            return _orjson.dumps(body)
        except TypeError:  # lone surrogates or exotic types: the standard library escapes them
            pass
    return json.dumps(body).encode()


def loads_body(raw: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except ValueError:  # invalid UTF-8 or lone surrogates: the lenient reading below
            pass
    return loads_lenient(raw)


def error_body(message: str, status: int, *, kind: str | None = None, code: str | int | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}}
