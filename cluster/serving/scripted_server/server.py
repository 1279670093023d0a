"""A scripted OpenAI-compatible server over a ScriptedModel, with fault injection: the routes of ``routes`` over
aiohttp, plus ``GET|POST /admin/faults`` (read / replace the faults; replacing resets their counters) and
``GET|DELETE /admin/stats`` (request counters by status, in-flight high-water mark; DELETE resets).
Streamed replies are written event by event. With a token (``token``, or generated on a host other than loopback)
every route answers 401 to a request without ``Authorization: Bearer <token>`` (``rollout.access``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from aiohttp import web
from pydantic import ValidationError

from cluster.serving.scripted_server.api import Reply
from cluster.serving.scripted_server.config import FaultsConfig, ScriptedServerConfig
from cluster.serving.scripted_server.routes import ScriptedRoutes
from rollout.access import allowed, listening_line, presented, refusal_body, token_for
from rollout.config.load import config_error
from rollout.gc_tuning import tune_gc
from rollout.models.scripted import ScriptedModel
from rollout.wire.chat import error_body, raise_open_file_limit

__all__ = ["ScriptedServer", "ScriptedServerConfig", "FaultsConfig", "Reply", "error_body", "fake_server", "serve",
           "serve_in_thread", "start_scripted_server"]


class ScriptedServer(ScriptedRoutes):
    """One running scripted server. Use ``start_scripted_server`` / ``fake_server`` / ``serve_in_thread``."""

    def __init__(self, config: ScriptedServerConfig, model: ScriptedModel | None = None):
        super().__init__(config, model)
        self.url = self.root_url = ""
        """``http://host:port/v1`` for clients; ``root_url`` (no /v1) for /health and /admin."""
        self._runner: web.AppRunner | None = None
        self.token = token_for(config.host, config.token)
        """The token every request needs, None for none: ``config.token``, else one generated on a host other than
        loopback."""
        self.token_generated = self.token is not None and not config.token
        """Whether ``token`` was generated here (so it is said once, at start)."""

    async def start(self) -> "ScriptedServer":
        raise_open_file_limit()
        app = web.Application(middlewares=[self._guard] if self.token else [])
        app.router.add_get("/admin/faults", _get(lambda: self.faults.model_dump()))
        app.router.add_post("/admin/faults", self._set_faults)
        app.router.add_get("/admin/stats", _get(self.stats_json))
        app.router.add_delete("/admin/stats", _get(self.reset_stats))
        app.router.add_route("*", "/{path:.*}", self._handle)
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

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if allowed(presented(request.headers.get), self.token):
            return await handler(request)
        return web.json_response(refusal_body("the scripted server"), status=401,
                                 headers={"WWW-Authenticate": "Bearer"})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            self.set_faults(FaultsConfig.model_validate(await request.json()))
        except (ValueError, ValidationError) as exc:
            msg = str(config_error(exc, "faults")) if isinstance(exc, ValidationError) else "body is not JSON"
            return web.json_response(error_body(msg, 400), status=400)
        return web.json_response(self.faults.model_dump())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            raw, too_large = await request.read(), None
        except web.HTTPRequestEntityTooLarge as exc:  # answered like any other status, so that stats count it
            raw, too_large = b"", exc.text or "request body too large"
        reply = await self.route(request.method, request.path, raw, request.headers.get("X-Rollout-Id", ""), too_large)
        if reply.events is None:
            return web.Response(body=b"".join(reply.chunks()), status=reply.status, headers=reply.headers,
                                content_type=reply.media_type)
        response = web.StreamResponse(status=reply.status, headers={
            **(reply.headers or {}), "Content-Type": reply.media_type, "Cache-Control": "no-cache"})
        with contextlib.suppress(ConnectionResetError):  # the client stopped reading the stream
            await response.prepare(request)
            for chunk in reply.chunks():
                await response.write(chunk)
            await response.write_eof()
        return response


def _get(produce: Callable[[], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(produce())

    return handler


async def start_scripted_server(config: ScriptedServerConfig | None = None,
                                model: ScriptedModel | None = None) -> ScriptedServer:
    """Start a server on the running loop; ``model`` replaces the one the config describes."""
    return await ScriptedServer(config or ScriptedServerConfig(), model).start()


@contextlib.asynccontextmanager
async def fake_server(
    config: ScriptedServerConfig | None = None, model: ScriptedModel | None = None
) -> AsyncIterator[ScriptedServer]:
    server = await start_scripted_server(config, model)
    try:
        yield server
    finally:
        await server.stop()


@contextlib.contextmanager
def serve_in_thread(config: ScriptedServerConfig | None = None,
                    model: ScriptedModel | None = None) -> Iterator[ScriptedServer]:
    """A server on its own loop in a daemon thread, for sync code and tests that call asyncio.run."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-openai-server", daemon=True)
    thread.start()
    try:
        server = asyncio.run_coroutine_threadsafe(start_scripted_server(config, model), loop).result(timeout=30)
        try:
            yield server
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def serve(config: ScriptedServerConfig | None = None) -> None:
    """Run until interrupted (``rollout fake-server``); prints the URL first."""
    tune_gc()

    async def main() -> None:
        async with fake_server(config) as server:
            print(f"fake OpenAI-compatible server at {server.url}", flush=True)
            print(listening_line("the scripted server", server.url, server.token, generated=server.token_generated,
                                 field="token"), flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
