"""The scripted server's OpenAI routes over a ScriptedModel, with its injected faults and request counters: the one
answer of the aiohttp scripted server (``fake_server``) and of the Ray Serve scripted app (``cluster.serving``).

Routes: ``POST /v1/chat/completions`` (``stream``, ``n``, ``max_tokens``, ``logprobs``/``top_logprobs``),
``POST /v1/completions`` (text or token-id prompts), ``POST /inference/v1/generate`` and ``POST /tokenize``
(``token_routes``), ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``POST /v1/sessions/release``;
anything else is an OpenAI-shaped 404, a request for another model a 404 (``model_not_found``), and a request
OpenAI would refuse its 400 naming the field (``checks``). The request's ``metadata`` (or ``X-Rollout-Id`` header)
becomes the policy's ``RequestMeta``; its ``task_id`` finds the task in ``dataset`` so a policy can read it."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from cluster.serving.scripted_server.api import Reply, chat_reply, text_reply
from cluster.serving.scripted_server.checks import ApiRequest, Invalid, load_object, parse_request
from cluster.serving.scripted_server.config import FaultsConfig, ScriptedServerConfig
from cluster.serving.scripted_server.stream import chat_events, text_events
from cluster.serving.scripted_server.token_routes import generate_events, generate_reply, parse_generate, tokenize_reply
from rollout.data.dataset import load_tasks
from rollout.errors import ContextLengthExceeded, ModelError
from rollout.models import scripted_tokens
from rollout.models.policies import echo
from rollout.models.scripted import ScriptedModel, ScriptedModelConfig
from rollout.protocols import ModelResponse
from rollout.records import RequestMeta
from rollout.wire.chat import context_length_error, error_body, meta_from_request
from rollout.wire.generate import GENERATE_PATH

KINDS = {"/chat/completions": "chat", "/completions": "text", GENERATE_PATH: "generate"}
"""The completion routes (below ``/v1`` but generate's) and the kind of request each answers."""


class ScriptedRoutes:
    """The routes of one scripted server, without a listener: ``route`` answers a request."""

    def __init__(self, config: ScriptedServerConfig, model: ScriptedModel | None = None):
        self.config = config
        self.faults = config.faults
        # The scripted policy only looks tasks up by id; the run that names the dataset has checked its paths.
        tasks = ({task.task_id: task for task in load_tasks(config.dataset, allow_outside_paths=True)}
                 if config.dataset else {})
        self._owns_model = model is None
        if model is None and config.policy is None and config.outputs is None:
            model = ScriptedModel(policy=echo, tasks=tasks, name=config.model)
        self.model = model or ScriptedModel.from_config(
            ScriptedModelConfig(outputs=config.outputs, policy=config.policy, name=config.model), tasks=tasks
        )
        self.requests = self.in_flight = self.max_in_flight = 0
        self.by_status: Counter[int] = Counter()
        self._seen: Counter[str] = Counter()  # requests per rollout id, for the first-n faults
        self._ids = itertools.count(1)

    def set_faults(self, faults: FaultsConfig) -> None:
        self.faults = faults
        self._seen.clear()

    def stats_json(self) -> dict[str, Any]:
        by_status = {str(code): n for code, n in self.by_status.items()}
        return {
            "requests": self.requests,
            "by_status": by_status,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
        }

    def reset_stats(self) -> dict[str, Any]:
        self.requests, self.max_in_flight = 0, self.in_flight
        self.by_status.clear()
        return self.stats_json()

    def models_json(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "rollout-farm"}],
        }

    async def route(self, method: str, path: str, raw: bytes = b"", rollout_header: str = "",
                    too_large: str | None = None) -> Reply:
        """One request to an OpenAI route answered. The aiohttp server and the Ray Serve scripted app
        (``cluster.serving.kinds.scripted``) both answer through this; ``too_large`` refuses the body with 413."""
        endpoint = path.rstrip("/")
        endpoint = endpoint[len("/v1"):] if endpoint.startswith("/v1/") else endpoint
        if method == "POST" and endpoint in KINDS:
            return await self.answer(raw, rollout_header, KINDS[endpoint], too_large)
        if method == "POST" and endpoint == "/tokenize":
            return self._tokenize(raw)
        if method == "GET" and endpoint == "/models":
            return Reply(200, self.models_json())
        if method == "GET" and endpoint.startswith("/models/"):
            name = endpoint[len("/models/"):]
            return Reply(200, self.models_json()["data"][0]) if name == self.config.model else self._no_model(name)
        if method == "GET" and endpoint == "/health":
            return Reply(200, {"status": "ok"})
        if method == "POST" and endpoint == "/sessions/release":
            return Reply(200, {"released": True})
        return Reply(404, error_body(f"Invalid URL ({method} {path}): not a route of this server", 404,
                                     kind="NotFoundError", code="unknown_url"))

    def _tokenize(self, raw: bytes) -> Reply:
        try:
            if self._other_model(name := load_object(raw).get("model")):
                return self._no_model(name)
            return Reply(200, tokenize_reply(raw))
        except Invalid as exc:
            return Reply(400, exc.body())

    def _other_model(self, name: Any) -> bool:
        """The request names a model this server does not serve (none named: the served one, as vLLM takes it)."""
        return self.config.check_model and name not in (None, "") and name != self.config.model

    def _no_model(self, name: Any) -> Reply:
        message = f"The model `{name}` does not exist; this server serves `{self.config.model}`."
        return Reply(404, error_body(message, 404, kind="NotFoundError", code="model_not_found", param="model"))

    async def answer(self, raw: bytes, rollout_header: str = "", kind: str = "chat",
                     too_large: str | None = None) -> Reply:
        """One completions request body (``kind``: ``chat``, ``text`` or ``generate``) answered, and counted in the
        stats."""
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if too_large:
                reply = Reply(413, error_body(too_large, 413))
            else:
                reply = await self._answer(raw, rollout_header, kind)
        finally:
            self.in_flight -= 1
        self.by_status[reply.status] += 1
        return reply

    async def _answer(self, raw: bytes, rollout_header: str, kind: str) -> Reply:
        try:
            req = parse_generate(raw) if kind == "generate" else parse_request(raw, kind)
        except Invalid as exc:
            return Reply(400, exc.body())
        if self._other_model(req.body.get("model")):
            return self._no_model(req.body.get("model"))
        meta = meta_from_request(req.body, rollout_header)
        faults = self.faults
        faulty = meta.rollout_id.startswith(faults.match)
        if faulty and (refused := await self._fault(faults, raw, req, meta)) is not None:
            return refused
        if self.config.latency:
            await asyncio.sleep(self.config.latency)
        try:
            responses = await self._complete(req, meta)
        except ContextLengthExceeded as exc:
            return Reply(400, error_body(f"This model's maximum context length is exceeded: {exc}", 400))
        except ModelError as exc:
            status = 500 if exc.retryable else 400
            return Reply(status, error_body(str(exc), status))
        except Exception as exc:  # noqa: BLE001 - a broken policy is the server's 500, counted like one
            return Reply(500, error_body(f"policy failed: {type(exc).__name__}: {exc}", 500))
        finally:
            if self._owns_model:  # it keeps every request's identity for tests; a server must not grow
                self.model.requests.clear()
        if kind == "generate":
            request_id = str(req.body.get("request_id") or f"generate-tokens-{next(self._ids)}")
            reply = generate_reply(req, responses, request_id, self.config.model, meta.policy_version)
            events = generate_events(reply, req.include_usage) if req.stream else None
            return Reply(200, reply, events=events)
        chat = kind == "chat"
        completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        reply = (chat_reply if chat else text_reply)(req, responses, completion_id, self.config.model)
        for choice in reply["choices"] if faulty and faults.lone_surrogates else []:
            # json.dumps writes it as the escape a strict decoder refuses
            if chat and isinstance(choice["message"]["content"], str):
                choice["message"]["content"] += "\ud800"
            elif not chat:
                choice["text"] += "\ud800"
        if req.stream:
            return Reply(200, reply, events=(chat_events if chat else text_events)(reply, req.include_usage))
        return Reply(200, reply)

    async def _fault(self, faults: FaultsConfig, raw: bytes, req: ApiRequest, meta: RequestMeta) -> Reply | None:
        """The injected fault's answer to a matching request, if it gets one."""
        if faults.max_request_bytes is not None and len(raw) > faults.max_request_bytes:
            message = f"request body of {len(raw)} bytes is over the limit of {faults.max_request_bytes}"
            return Reply(413, error_body(message, 413))
        if faults.hang:
            await asyncio.sleep(faults.hang)
        if faults.fail_first_n or faults.rate_limit_first_n:  # count only then: a server must not grow
            self._seen[meta.rollout_id] += 1
            n = self._seen[meta.rollout_id]
            if n <= faults.fail_first_n:
                return Reply(faults.status, error_body(f"injected failure {n} of {faults.fail_first_n}", faults.status))
            if n <= faults.fail_first_n + faults.rate_limit_first_n:
                return Reply(429, error_body("injected rate limit", 429), {"Retry-After": f"{faults.retry_after:g}"})
        limit = faults.context_length_after_tokens
        ids = req.prompt_ids[0] if req.prompt_ids else scripted_tokens.prompt_token_ids(req.prompts[0])
        if limit is not None and (n_prompt := len(ids)) > limit:
            message = context_length_error(limit, n_prompt, req.body.get("max_tokens") or 0)
            return Reply(400, error_body(message, 400))
        return None

    async def _complete(self, req: ApiRequest, meta: RequestMeta) -> list[ModelResponse]:
        """``n`` replies per prompt. Choice i > 0 asks the policy under seed + i; replayed outputs are one per
        request (a rollout's next turn must not skip any), so their choices are the same."""
        tools, out = req.body.get("tools") if req.kind == "chat" else None, []
        for messages in req.prompts:
            for i in range(req.n):
                if i and self.model.policy is None:
                    out.append(out[-1])
                    continue
                seeded = meta.model_copy(update={"seed": (meta.seed or 0) + i}) if i else meta
                out.append(await self.model.complete(messages, tools, meta=seeded))
        return out

