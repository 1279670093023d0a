"""The model gateway's engine, whatever HTTP server is in front of it: ``/rollouts/<rollout_id>/v1`` is an
OpenAI-compatible base URL in front of an upstream OpenAI-compatible model (our Serve model, vLLM, the scripted
server), so an agent that only speaks OpenAI (a CLI coding agent in a container, ``agents.external_agent``) can be
farmed, its token data kept. Served over HTTP by ``cluster.gym.gateway`` (a gateway of one's own), and over a unix
socket bound into each sandbox by ``sandbox`` (the gateway a run opens itself).

A chat completion is forwarded upstream asking for ``logprobs`` and ``return_token_ids`` (as ``OpenAIModel`` does),
with the rollout's identity (``metadata``, the session header that keeps a rollout on one replica). The agent gets
the upstream's reply, without the token fields it did not ask for; ``stream: true`` is answered as server-sent
events built from the full reply. Upstream errors come back OpenAI-shaped (``{"error": {"message", "type", "param",
"code"}}``) with the upstream's status; an unreachable upstream (or a reply that is not a chat completion) is a 502
of the same shape.

Each call is recorded (``call_store``): messages, tools, reply, finish_reason, usage, token ids, logprobs,
``started_at`` and ``seconds``, and its ``parent``: the earlier call whose messages + reply are the longest prefix
of its messages; one that extends none (a compacted or rewritten prompt) starts a new ``segment``.
``rollout.wire.gateway_calls.calls_to_steps`` turns a rollout's calls into Steps, token segments and contiguity
breaks.

Memory is bounded: at most ``max_calls_per_rollout`` calls per rollout (the oldest dropped, and counted), at most
``max_rollouts`` rollouts (the least recently used dropped), a rollout untouched for ``ttl`` seconds forgotten.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
from pydantic import Field

from cluster.gateway.call_store import CallStore
from cluster.gateway.replies import Reply, as_events, decode_reply, error_message, error_reply, json_reply
from rollout.config.load import StrictModel
from rollout.wire.chat import SESSION_HEADER, parse_response, snippet


class GatewayConfig(StrictModel):
    upstream_base_url: str
    """The upstream's OpenAI base URL (``http://host:port/v1``)."""
    model: str | None = None
    """Replace the model the agent names with this one (and list only it); none: pass it through."""
    api_key: str | None = None
    """Sent upstream as the bearer token (the agent's own key is never forwarded)."""
    timeout: float = Field(600.0, gt=0)
    """Seconds an upstream request may take."""
    send_metadata: bool = True
    """Put ``metadata: {rollout_id}`` in the upstream body (off for servers that reject unknown fields)."""
    max_calls_per_rollout: int = Field(1000, ge=1)
    max_rollouts: int = Field(10_000, ge=1)
    ttl: float = Field(3600.0, gt=0)
    """Seconds after its last call (or read) a rollout's calls are forgotten."""


class Gateway:
    """The routes and the recorded calls of every rollout; one upstream client session per event loop."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.upstream = config.upstream_base_url.rstrip("/")
        self.store = CallStore(config.max_calls_per_rollout, config.max_rollouts, config.ttl)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = self._sessions[loop] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return session

    async def aclose(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    async def _send(self, method: str, path: str, body: Any = None,
                    rollout_id: str = "") -> tuple[int, Any] | Reply:
        """(status, decoded JSON) of an upstream request, or the OpenAI-shaped error response to give the agent."""
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        if rollout_id:
            headers.update({"X-Rollout-Id": rollout_id, SESSION_HEADER: rollout_id})
        url = self.upstream + path
        try:
            async with self._session().request(method, url, data=None if body is None else orjson.dumps(body),
                                               headers=headers,
                                               timeout=aiohttp.ClientTimeout(total=self.config.timeout)) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return error_reply(f"upstream {url} cannot be reached: {type(exc).__name__}: {exc}", 502)
        data, text = decode_reply(raw), raw.decode("utf-8", "replace")
        if status != 200:
            got = data.get("error", data) if isinstance(data, dict) else None
            if isinstance(got, dict) and "message" in got:
                return json_reply({"error": {k: got.get(k) for k in ("message", "type", "param", "code")}}, status)
            return error_reply(f"upstream HTTP {status}: {snippet(text)}", status)
        if data is None:
            return error_reply(f"upstream {url} answered with a body that is not JSON: {snippet(text)}", 502)
        return status, data

    async def chat_body(self, rollout_id: str, raw: bytes, metadata: dict[str, str] | None = None,
                        recorded: dict[str, Any] | None = None) -> Reply:
        """A chat completion request's raw body, forwarded and recorded; ``metadata``: the rollout's identity to
        send upstream (a served policy finds its task by it), else ``{rollout_id}``; ``recorded``: more fields of
        the call's record (the policy version the rollout runs under)."""
        try:
            body = orjson.loads(raw)
            messages = body["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return error_reply("body must be a JSON object with messages: a list of message objects", 400)
        stream, options = bool(body.pop("stream", False)), body.pop("stream_options", None) or {}
        wants_ids, wants_logprobs = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
        upstream = {**body, "logprobs": True, "return_token_ids": True}
        if self.config.model:
            upstream["model"] = self.config.model
        if self.config.send_metadata:
            own = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            upstream["metadata"] = {**own, **(metadata or {}), "rollout_id": rollout_id}
        started, t0 = time.time(), time.perf_counter()
        got = await self._send("POST", "/chat/completions", upstream, rollout_id)
        call: dict[str, Any] = {"messages": messages, "tools": body.get("tools"), "message": None,
                                "started_at": started, "seconds": time.perf_counter() - t0, **(recorded or {})}
        if isinstance(got, Reply):
            self.store.record(rollout_id, {**call, "status": got.status, "error": error_message(got)})
            return got
        data = got[1]
        try:
            reply = parse_response(data)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            error = error_reply(f"upstream reply is not a chat completion ({exc!r}): {snippet(str(data))}", 502)
            self.store.record(rollout_id, {**call, "status": 502, "error": error_message(error)})
            return error
        self.store.record(rollout_id, {
            **call, "message": reply.message, "finish_reason": reply.finish_reason, "usage": reply.usage.model_dump(),
            "prompt_token_ids": reply.prompt_token_ids, "completion_token_ids": reply.completion_token_ids,
            "logprobs": reply.logprobs, "model": reply.model, "status": 200, "error": None,
        })
        if not wants_ids:
            data.pop("prompt_token_ids", None)
        for choice in data.get("choices") or []:
            if not wants_ids:
                choice.pop("token_ids", None)
            if not wants_logprobs:
                choice["logprobs"] = None
        if stream:
            chunks = b"".join(as_events(data, bool(options.get("include_usage"))))
            return Reply(200, chunks, "text/event-stream")
        return json_reply(data, 200)

    async def models(self, rollout_id: str) -> Reply:
        if self.config.model:
            listed = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "rollout-farm"}
            return json_reply({"object": "list", "data": [listed]}, 200)
        got = await self._send("GET", "/models")
        return got if isinstance(got, Reply) else json_reply(got[1], 200)

    def calls_reply(self, rollout_id: str) -> Reply:
        return json_reply({"rollout_id": rollout_id, "dropped": self.store.dropped(rollout_id),
                           "calls": self.store.calls(rollout_id)}, 200)

    def forget_reply(self, rollout_id: str) -> Reply:
        return json_reply({"rollout_id": rollout_id, "forgotten": self.store.forget(rollout_id)}, 200)
