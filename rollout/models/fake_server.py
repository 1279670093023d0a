"""A fake OpenAI-compatible chat-completions server over a ScriptedModel, with fault injection.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET|POST /admin/faults`` (read / replace the faults; replacing resets their counters),
``GET|DELETE /admin/stats`` (request counters by status, in-flight high-water mark; DELETE resets).
The request's ``metadata`` (or ``X-Rollout-Id`` header) becomes the policy's ``RequestMeta``; its
``task_id`` finds the task in ``dataset`` so a policy can read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections import Counter
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from aiohttp import web
from pydantic import ValidationError

from rollout.config import config_error
from rollout.dataset import load_tasks
from rollout.errors import ContextLengthExceeded, ModelError
from rollout.models import fake_tokens
from rollout.models.fake_server_config import FakeServerConfig, FaultsConfig
from rollout.models.openai_wire import completion_json, context_length_error, meta_from_request, raise_open_file_limit
from rollout.models.scripted import ScriptedModel, ScriptedModelConfig


class FakeServer:
    """One running fake server. Use ``start_fake_server`` / ``fake_server`` / ``serve_in_thread``."""

    def __init__(self, config: FakeServerConfig, model: ScriptedModel | None = None):
        self.config = config
        self.faults = config.faults
        # The scripted policy only looks tasks up by id; the run that names the dataset has checked its paths.
        tasks = ({task.task_id: task for task in load_tasks(config.dataset, allow_outside_paths=True)}
                 if config.dataset else {})
        self._owns_model = model is None
        if model is None and config.policy is None and config.outputs is None:
            from rollout.models.policies import echo

            model = ScriptedModel(policy=echo, tasks=tasks, name=config.model)
        self.model = model or ScriptedModel.from_config(
            ScriptedModelConfig(outputs=config.outputs, policy=config.policy, name=config.model), tasks=tasks
        )
        self.url = self.root_url = ""
        """``http://host:port/v1`` for clients; ``root_url`` (no /v1) for /health and /admin."""
        self.requests = self.in_flight = self.max_in_flight = 0
        self.by_status: Counter[int] = Counter()
        self._seen: Counter[str] = Counter()  # requests per rollout id, for the first-n faults
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    async def start(self) -> "FakeServer":
        raise_open_file_limit()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", _get(self.models_json))
        app.router.add_get("/health", _get(lambda: {"status": "ok"}))
        app.router.add_get("/admin/faults", _get(lambda: self.faults.model_dump()))
        app.router.add_post("/admin/faults", self._set_faults)
        app.router.add_get("/admin/stats", _get(self.stats_json))
        app.router.add_delete("/admin/stats", _get(self.reset_stats))
        # No access log (a line per request costs more than the request); cancel a handler when
        # its client disconnects, so a hang fault does not outlive the client's timeout; and do
        # not let stop() wait for hung requests.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, backlog=self.config.backlog)
        await site.start()
        port = self._runner.addresses[0][1]
        self.root_url = f"http://{self.config.host}:{port}"
        self.url = self.root_url + "/v1"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            self.set_faults(FaultsConfig.model_validate(await request.json()))
        except (ValueError, ValidationError) as exc:
            msg = str(config_error(exc, "faults")) if isinstance(exc, ValidationError) else "body is not JSON"
            return web.json_response(error_body(msg, 400), status=400)
        return web.json_response(self.faults.model_dump())

    async def _chat(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            status, payload, headers = await self._answer(request)
        finally:
            self.in_flight -= 1
        self.by_status[status] += 1
        return web.Response(body=json.dumps(payload), status=status, headers=headers, content_type="application/json")

    async def _answer(self, request: web.Request) -> tuple[int, dict[str, Any], dict[str, str] | None]:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:  # answered like any other status, so that stats count it
            return 413, error_body(exc.text or "request body too large", 413), None
        return await self.answer(raw, request.headers.get("X-Rollout-Id", ""))

    async def answer(self, raw: bytes, rollout_header: str = "") -> tuple[int, dict[str, Any], dict[str, str] | None]:
        """One chat-completions request body answered: (status, JSON payload, extra headers). The aiohttp server
        and the Ray Serve scripted app (``cluster.serving.scripted_app``) both answer through this."""
        try:
            body = json.loads(raw)
            messages = body["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return 400, error_body("body must be a JSON object with messages: a list of message objects", 400), None
        if body.get("stream"):
            return 400, error_body("the fake server does not stream", 400), None
        if self.config.check_model and body.get("model") != self.config.model:
            return 404, error_body(f"The model `{body.get('model')}` does not exist; this server serves "
                               f"`{self.config.model}`.", 404, kind="NotFoundError", code="model_not_found"), None
        meta = meta_from_request(body, rollout_header)
        faults = self.faults
        faulty = meta.rollout_id.startswith(faults.match)
        if faulty:
            if faults.max_request_bytes is not None and len(raw) > faults.max_request_bytes:
                message = f"request body of {len(raw)} bytes is over the limit of {faults.max_request_bytes}"
                return 413, error_body(message, 413), None
            if faults.hang:
                await asyncio.sleep(faults.hang)
            if faults.fail_first_n or faults.rate_limit_first_n:  # count only then: a server must not grow
                self._seen[meta.rollout_id] += 1
                n = self._seen[meta.rollout_id]
                if n <= faults.fail_first_n:
                    message = f"injected failure {n} of {faults.fail_first_n}"
                    return faults.status, error_body(message, faults.status), None
                if n <= faults.fail_first_n + faults.rate_limit_first_n:
                    return 429, error_body("injected rate limit", 429), {"Retry-After": f"{faults.retry_after:g}"}
            limit = faults.context_length_after_tokens
            if limit is not None and (n_prompt := len(fake_tokens.prompt_token_ids(messages))) > limit:
                return 400, error_body(context_length_error(limit, n_prompt, body.get("max_tokens") or 0), 400), None
        if self.config.latency:
            await asyncio.sleep(self.config.latency)
        try:
            response = await self.model.complete(messages, body.get("tools"), meta=meta)
        except ContextLengthExceeded as exc:
            return 400, error_body(f"This model's maximum context length is exceeded: {exc}", 400), None
        except ModelError as exc:
            status = 500 if exc.retryable else 400
            return status, error_body(str(exc), status), None
        except Exception as exc:  # noqa: BLE001 - a broken policy is the server's 500, counted like one
            return 500, error_body(f"policy failed: {type(exc).__name__}: {exc}", 500), None
        finally:
            if self._owns_model:  # it keeps every request's identity for tests; a server must not grow
                self.model.requests.clear()
        reply = completion_json(response, body, f"chatcmpl-{next(self._ids)}", self.config.model)
        message = reply["choices"][0]["message"]
        if faulty and faults.lone_surrogates and isinstance(message["content"], str):
            message["content"] += "\ud800"  # json.dumps writes it as the escape a strict decoder refuses
        return 200, reply, None


def _get(produce: Callable[[], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(produce())

    return handler


def error_body(message: str, status: int, *, kind: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status if code is None else code}}


async def start_fake_server(config: FakeServerConfig | None = None, model: ScriptedModel | None = None) -> FakeServer:
    """Start a server on the running loop; ``model`` replaces the one the config describes."""
    return await FakeServer(config or FakeServerConfig(), model).start()


@contextlib.asynccontextmanager
async def fake_server(
    config: FakeServerConfig | None = None, model: ScriptedModel | None = None
) -> AsyncIterator[FakeServer]:
    server = await start_fake_server(config, model)
    try:
        yield server
    finally:
        await server.stop()


@contextlib.contextmanager
def serve_in_thread(config: FakeServerConfig | None = None, model: ScriptedModel | None = None) -> Iterator[FakeServer]:
    """A server on its own loop in a daemon thread, for sync code and tests that call asyncio.run."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-openai-server", daemon=True)
    thread.start()
    try:
        server = asyncio.run_coroutine_threadsafe(start_fake_server(config, model), loop).result(timeout=30)
        try:
            yield server
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def serve(config: FakeServerConfig | None = None) -> None:
    """Run until interrupted (``rollout fake-server``); prints the URL first."""
    from rollout.gc_tuning import tune_gc

    tune_gc()

    async def main() -> None:
        async with fake_server(config) as server:
            print(f"fake OpenAI-compatible server at {server.url}", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
