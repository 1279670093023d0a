"""A scripted policy as an OpenAI-compatible Ray Serve deployment: the demos and CI take the Serve path a GPU
run takes (HTTP proxy, request router, replicas), with the policy in place of an engine.

Stateless: a policy finds its task from the rollout identity each request carries (``metadata.task_id``, looked
up in the run's dataset) and its turn from the conversation, so any replica can answer any turn. Routes:
``POST /v1/chat/completions`` (the fake server's answer, faults included), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``, ``POST /v1/sessions/release``; anything else is an OpenAI-shaped 404.
Every reply names its replica in ``x-serve-replica`` (routing tests and ``bench_serve`` read it).
"""

from __future__ import annotations

import json
from typing import Any

from ray import serve


class ScriptedPolicyServer:
    def __init__(self, server_config: dict[str, Any]):
        from rollout.models.fake_server import FakeServer
        from rollout.models.fake_server_config import FakeServerConfig

        from cluster.serving.task_board import BoardTasks

        self.server = FakeServer(FakeServerConfig.model_validate(server_config))
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        # a trainer's tasks, posted by the farm for this application (the dataset's come first)
        self.server.model.tasks = BoardTasks(context.app_name, self.server.model.tasks)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        from rollout.models.fake_server import error_body

        path, method = app_path(request).rstrip("/"), request.method
        headers = {"x-serve-replica": self.replica}
        model = self.server.config.model
        if method == "POST" and path.endswith("/chat/completions"):
            rollout = request.headers.get("x-rollout-id", "")
            status, payload, extra = await self.server.answer(await request.body(), rollout)
            headers.update(extra or {})
        elif method == "GET" and path.endswith("/models"):
            status, payload = 200, self.server.models_json()
        elif method == "GET" and "/models/" in path:
            name = path.split("/models/", 1)[1]
            status, payload = (200, self.server.models_json()["data"][0]) if name == model else (
                404, error_body(f"The model `{name}` does not exist.", 404, kind="NotFoundError",
                                 code="model_not_found"))
        elif path in ("/health", "/v1/health"):
            status, payload = 200, {"status": "ok"}
        elif method == "POST" and path.endswith("/sessions/release"):
            status, payload = 200, {"released": True}
        else:
            status, payload = 404, error_body(f"{method} {path} is not a route of this server", 404,
                                              kind="NotFoundError")
        return Response(json.dumps(payload), status_code=status, headers=headers, media_type="application/json")


def app_path(request: Any) -> str:
    """The request's path below the application's route prefix."""
    path, root = request.scope["path"], request.scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def build(server_config: dict[str, Any], options: dict[str, Any]) -> Any:
    """The Serve application: ``server_config`` is a ``FakeServerConfig``'s fields, ``options`` deployment options."""
    deployment = serve.deployment(ScriptedPolicyServer, name="ScriptedPolicyServer")
    return deployment.options(**options).bind(server_config)
