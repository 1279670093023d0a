"""OpenAIModel: an async aiohttp client for any OpenAI-compatible chat-completions endpoint.

Built to hold thousands of requests in flight from one process: the connection pool is unbounded
(``max_connections: 0``) and an ``asyncio.Semaphore`` of ``max_concurrency`` is the one bound,
because a pool that queues waiters itself is where clients stall at high concurrency (httpx did
at 16k in flight); a semaphore's queue costs O(1) per request.

YAML: ``model: {type: openai, base_url: http://127.0.0.1:8000/v1, model: NAME, sampling:
{temperature: 0.7}, return_token_ids: true, logprobs: true}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any, Mapping

import aiohttp

from rollout.config.load import validate
from rollout.errors import ContextLengthExceeded, ModelError
from rollout.models.client.config import OpenAIModelConfig
from rollout.models.client.http1 import ConnectionFailed
from rollout.models.client.sessions import LoopSessions, LoopState
from rollout.models.client.token_in import TokenStreams
from rollout.protocols import ModelResponse
from rollout.records import Message, RequestMeta
from rollout.wire.chat import (
    RELEASE_PREFIX,
    SESSION_HEADER,
    dumps_body as _dumps,
    is_context_length_error,
    loads_body as _loads,
    parse_response,
    parse_retry_after,
    request_metadata,
    snippet,
)

CONTEXT_LENGTH_STATUSES = (400, 422)
"""Statuses with which servers refuse a prompt past the context window (told apart by the body's wording)."""
BODY_TOO_LARGE = 413
"""The request body is over the server's (or its proxy's) limit: the conversation outgrew what the server takes,
which is the token limit, whatever the body says (nginx's 413 is an HTML page)."""
RETRY_STATUSES = frozenset({408, 409, 425, 429})
"""Retried like 5xx: timeouts, conflicts, too early, rate limits."""


class OpenAIModel(LoopSessions):
    """The ``Model`` seam over HTTP. Safe to share across all rollouts of a process."""

    def __init__(self, config: OpenAIModelConfig | None = None, **fields: Any):
        self.config = config or validate(OpenAIModelConfig, fields, "model")
        self.url = self.config.base_url.rstrip("/") + "/chat/completions"
        key = self.config.api_key if self.config.api_key is not None else os.environ.get(self.config.api_key_env, "")
        self._headers = {"Content-Type": "application/json", **self.config.extra_headers}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._loops: dict[asyncio.AbstractEventLoop, LoopState] = {}
        self._streams: TokenStreams | None = None  # token-in mode's per-rollout token streams

    @classmethod
    def from_config(cls, config: OpenAIModelConfig | Mapping[str, Any], **_: Any) -> "OpenAIModel":
        # Keyword arguments the scripted model takes (tasks=) mean nothing here.
        if not isinstance(config, OpenAIModelConfig):
            config = validate(OpenAIModelConfig, dict(config), "model")
        return cls(config)

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        meta: RequestMeta | None = None,
        **sampling: Any,
    ) -> ModelResponse:
        if self.config.token_in:
            return await self._token_streams().complete(messages, tools, meta, sampling)
        data = await self._post(self.request_body(messages, tools, meta, sampling), self._request_headers(meta))
        try:
            return parse_response(data, self.config.model)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ModelError(f"POST {self.url}: malformed response ({exc!r}): {snippet(json.dumps(data))}") from None

    def _token_streams(self) -> TokenStreams:
        self._streams = self._streams or TokenStreams(self)
        return self._streams

    def request_body(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, meta: RequestMeta | None, sampling: dict
    ) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "messages": messages}
        body.update(cfg.sampling)
        body.update(sampling)
        if tools:
            body["tools"] = tools
            if cfg.tool_choice is not None:
                body.setdefault("tool_choice", cfg.tool_choice)
        if cfg.logprobs:
            body["logprobs"] = True
        if cfg.return_token_ids:
            body["return_token_ids"] = True
        if meta is not None and cfg.send_metadata:
            body["metadata"] = request_metadata(meta)
        if meta is not None and cfg.cache_salt and meta.policy_version is not None:
            body["cache_salt"] = f"policy-{meta.policy_version}"
        body.update(cfg.extra_body)
        # A None means "leave it to the server" (e.g. seed=None from a context without a seed).
        return {k: v for k, v in body.items() if v is not None}

    def _request_headers(self, meta: RequestMeta | None) -> dict[str, str]:
        if meta is None or not meta.rollout_id:
            return self._headers
        # The rollout is the session: Ray Serve's proxy reads x-session-id, so a session-aware router keeps
        # every turn of a rollout on one replica (and its prefix cache).
        return {**self._headers, "X-Rollout-Id": meta.rollout_id, SESSION_HEADER: meta.rollout_id}

    async def end_session(self, meta: RequestMeta) -> None:
        """Forget the rollout's token stream; tell the server the rollout ended (``release_sessions``). Best
        effort, never raises."""
        if self._streams is not None:
            self._streams.forget(meta.rollout_id)
        if not self.config.release_sessions or not meta.rollout_id:
            return
        state, url = await self._state(), self.config.base_url.rstrip("/") + "/sessions/release"
        headers = {**self._headers, SESSION_HEADER: RELEASE_PREFIX + meta.rollout_id}
        try:
            async with state.session.post(url, data=b"{}", headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            pass  # the router forgets the session after its TTL anyway

    async def _post(self, body: dict[str, Any], headers: dict[str, str], url: str | None = None) -> Any:
        """POST with bounded retries; ``url`` defaults to the chat-completions URL (the only one the lean client
        keeps connections to; others go through aiohttp)."""
        target = url or self.url
        state = await self._state()
        payload = _dumps(body)
        timeout = state.timeout
        attempts = self.config.max_retries + 1
        last = ""
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                async with state.semaphore:  # noqa: SIM117 - the request starts only once a slot is free
                    if state.lean is not None and target == self.url:
                        extra = ({"X-Rollout-Id": headers["X-Rollout-Id"], SESSION_HEADER: headers[SESSION_HEADER]}
                                 if "X-Rollout-Id" in headers else None)
                        status, got, raw = await state.lean.post(payload, extra, self.config.timeout)
                        retry_after = parse_retry_after(got.get("retry-after"))
                    else:
                        async with state.session.post(target, data=payload, headers=headers,
                                                      timeout=timeout) as resp:
                            status, raw = resp.status, await resp.read()
                            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionFailed) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                text = "" if status == 200 else raw.decode("utf-8", errors="replace")
                if status == 200:
                    try:
                        return _loads(raw)
                    except ValueError:
                        last = f"HTTP 200 with a body that is not JSON: {snippet(raw.decode('utf-8', 'replace'))}"
                elif status in CONTEXT_LENGTH_STATUSES and is_context_length_error(text):
                    raise ContextLengthExceeded(f"POST {target}: HTTP {status}: {snippet(text)}")
                elif status == BODY_TOO_LARGE:
                    raise ContextLengthExceeded(f"POST {target}: HTTP 413: the request ({len(payload)} bytes, "
                                                f"the conversation so far) is over the server's body limit: "
                                                f"{snippet(text)}")
                elif status in RETRY_STATUSES or status >= 500:
                    last = f"HTTP {status}: {snippet(text)}"
                else:
                    raise ModelError(f"POST {target}: HTTP {status}: {snippet(text)}", retryable=False)
            if attempt + 1 < attempts:
                await asyncio.sleep(self._delay(attempt, retry_after))
        raise ModelError(f"POST {target} failed after {attempts} attempt(s); last: {last}")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        cfg = self.config
        # Jitter spreads the retries of thousands of rollouts that failed together.
        delay = min(cfg.max_backoff, cfg.backoff * 2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, cfg.max_backoff))
        return delay
