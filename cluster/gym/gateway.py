"""The per-rollout model gateway over HTTP, for a gateway of one's own (``gateway_router`` in an app of one's own,
``gateway_app`` standalone; the agent server mounts it too): the routes in front of ``cluster.gateway.engine``.

- ``POST /rollouts/{id}/v1/chat/completions``, ``GET /rollouts/{id}/v1/models``: the rollout's OpenAI base URL.
- ``GET /rollouts/{id}/calls`` (the recorded calls); ``DELETE /rollouts/{id}`` (forget them).
Anyone who reaches it may use any rollout's path: serve it where only the agents it is for reach it. The gateway a
run opens itself (``cluster.gateway.sandbox``) is the guarded one: a key per rollout, reached only from its sandbox.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from cluster.gateway.call_store import CallStore
from cluster.gateway.engine import Gateway, GatewayConfig
from cluster.gateway.replies import Reply, error_reply
from rollout.wire.gateway_calls import CallSteps, calls_to_steps

__all__ = ["Gateway", "GatewayConfig", "gateway_router", "gateway_app", "CallStore", "calls_to_steps", "CallSteps"]


def _response(reply: Reply) -> Response:
    headers = {"Cache-Control": "no-cache"} if reply.media_type == "text/event-stream" else None
    return Response(reply.body, status_code=reply.status, media_type=reply.media_type, headers=headers)


def _routes(gateway: Gateway) -> APIRouter:
    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        await gateway.aclose()

    router = APIRouter(lifespan=lifespan)

    async def chat(rollout_id: str, request: Request) -> Response:
        return _response(await gateway.chat_body(rollout_id, await request.body()))

    async def models(rollout_id: str) -> Response:
        return _response(await gateway.models(rollout_id))

    async def calls(rollout_id: str) -> Response:
        return _response(gateway.calls_reply(rollout_id))

    async def forget(rollout_id: str) -> Response:
        return _response(gateway.forget_reply(rollout_id))

    async def unknown(rollout_id: str, rest: str, request: Request) -> Response:
        return _response(error_reply(f"{request.method} /v1/{rest} is not a route of this gateway", 404,
                                     "NotFoundError"))

    router.add_api_route("/rollouts/{rollout_id:path}/v1/chat/completions", chat, methods=["POST"])
    router.add_api_route("/rollouts/{rollout_id:path}/v1/models", models, methods=["GET"])
    router.add_api_route("/rollouts/{rollout_id:path}/calls", calls, methods=["GET"])
    router.add_api_route("/rollouts/{rollout_id:path}/v1/{rest:path}", unknown,
                         methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    router.add_api_route("/rollouts/{rollout_id:path}", forget, methods=["DELETE"])
    return router


def gateway_router(upstream_base_url: str, **options: Any) -> APIRouter:
    """The gateway's routes for an app of one's own (``app.include_router``); ``options``: ``GatewayConfig``'s
    fields. The ``Gateway`` behind them is ``router.gateway``."""
    gateway = Gateway(GatewayConfig(upstream_base_url=upstream_base_url, **options))
    router = _routes(gateway)
    router.gateway = gateway  # type: ignore[attr-defined]
    return router


def gateway_app(upstream_base_url: str, **options: Any) -> FastAPI:
    """A standalone gateway app (serve it with uvicorn); its ``Gateway`` is ``app.state.gateway``."""
    router = gateway_router(upstream_base_url, **options)
    app = FastAPI(title="rollout-farm model gateway")
    app.include_router(router)
    app.state.gateway = router.gateway  # type: ignore[attr-defined]
    return app
