"""``POST /inference/v1/generate`` on a Ray Serve LLM application (``app: vllm``), which Ray 2.60's ingress lacks:
passed through to each replica's vLLM engine, whose own ``ServingTokens`` answers it (vLLM 0.32 builds one for
every generating engine, route or not), as Ray passes ``/v1/completions`` through. The ingress reads the session
header and routes on it, as it does for completions, so a rollout's turns keep their replica (and its prefix
cache) under the sticky router. ``POST /update_weight_version`` (with the control routes) labels every replica's
weights: a generate reply names the label of the weights that sampled each span of its tokens.

A ``tokens``-mode logprob entry also gets the ``"token_id:N"`` placeholder as ``token``
(``rollout.wire.generate.with_placeholders``): vLLM 0.32 sends only the integer ``token_id``, and clients written
against earlier releases (``renderers`` 0.1.12, which verifiers' training client uses) refuse an entry without it.

No ``from __future__ import annotations`` here: FastAPI reads the ingress methods' annotations as objects."""

import json
from typing import Any, AsyncIterator

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from cluster.session import ray_private
from rollout.access import AccessGuard, Keys
from rollout.wire.chat import error_body
from rollout.wire.generate import GENERATE_PATH, with_placeholders

ROUTES = {"generate_tokens": lambda app: app.post(GENERATE_PATH)}
CONTROL_ROUTES = {"update_weight_version": lambda app: app.post("/update_weight_version")}


class Generate:
    """Mixed into the model's ``LLMServer``: the route's answer from the replica's own engine."""

    async def generate_tokens(self, body: dict, raw_request_info: Any = None) -> AsyncIterator[Any]:
        """A dict ``{"status", "payload"}`` for a whole reply or an error, else the server-sent events' chunks."""
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest, GenerateResponseBase
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        _client, state = ray_private.vllm_engine_parts(self)
        try:
            request = GenerateRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(part) for part in first["loc"] if not str(part).startswith("is-instance"))
            yield {"status": 400, "payload": error_body(f"Invalid value for '{param}': {first['msg']}", 400,
                                                        kind="invalid_request_error", param=param)}
            return
        result = await state.serving_tokens.serve_tokens(request, ray_private.starlette_request(raw_request_info))
        if isinstance(result, ErrorResponse):
            yield {"status": result.error.code, "payload": result.model_dump(mode="json")}
        elif isinstance(result, GenerateResponseBase):
            yield {"status": 200, "payload": with_placeholders(result.model_dump(mode="json"))}
        else:
            async for chunk in result:
                yield _with_placeholders(chunk)

    async def update_weight_version(self, new_version: str) -> None:
        client, _state = ray_private.vllm_engine_parts(self)
        await client.update_weight_version(str(new_version))


def _with_placeholders(chunk: str) -> str:
    """One server-sent event, its logprob entries given their placeholders."""
    if not chunk.startswith("data: {"):
        return chunk
    return "data: " + json.dumps(with_placeholders(json.loads(chunk[len("data: "):]))) + "\n\n"


class GenerateIngress:
    """Mixed into Ray Serve LLM's ingress: the route, forwarded with the request's session like completions."""

    async def generate_tokens(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse(error_body("The request body must be a JSON object.", 400, code="invalid_json"), 400)
        name = body.get("model")
        try:
            model_id = await self._get_model_id(name)
        except Exception:  # noqa: BLE001 - Ray's HTTPException for a model it does not serve
            message = f"The model `{name}` does not exist."
            return JSONResponse(error_body(message, 404, kind="NotFoundError", code="model_not_found", param="model"),
                                404)
        handle = self._get_configured_serve_handle(model_id)
        session = ray_private.session_from_headers(request.headers)
        if session:
            handle = handle.options(session_id=session)
        stream = handle.generate_tokens.remote(body, ray_private.raw_request_info(request))
        first = await stream.__anext__()
        if isinstance(first, dict):
            return JSONResponse(first["payload"], status_code=first["status"])

        async def events() -> AsyncIterator[str]:
            yield first
            async for chunk in stream:
                yield chunk

        return StreamingResponse(events(), media_type="text/event-stream")

    async def update_weight_version(self, request: Request) -> Response:
        body = await request.json()
        await self._broadcast_to_replicas(body["model"], "update_weight_version",
                                          {"new_version": str(body["new_version"])})
        return Response(status_code=200)


def build_app(config: Any, controls: bool, keys: str | Keys | None = None) -> Any:
    """The application for ``config`` (an ``LLMConfig``): Ray's (development, with ``controls``) OpenAI app plus
    the generate route (and, with ``controls``, the weight-version route); with ``keys``, every route of its
    ingress (Ray's and ours) needs one."""
    routes = {**ROUTES, **(CONTROL_ROUTES if controls else {})}
    return ray_private.extended_openai_app(config, controls=controls, server_mixin=Generate,
                                           ingress_mixin=GenerateIngress, routes=guarded(routes, keys))


def guarded(routes: dict[str, Any], keys: str | Keys | None) -> dict[str, Any]:
    """``routes`` whose first route, as Ray's ingress builder adds it to the ingress's FastAPI app, also puts
    ``AccessGuard`` in front of the whole app: the one hook into the app Ray builds for its ingress (the builder
    takes route factories, each handed the app, and no middleware), so Ray's own routes are guarded too."""
    if keys is None:
        return routes
    name, first = next(iter(routes.items()))

    def guard_then_route(app: Any) -> Any:
        app.add_middleware(AccessGuard, token=keys, service="the model's HTTP face")
        return first(app)

    return {**routes, name: guard_then_route}
