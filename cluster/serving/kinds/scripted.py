"""A scripted policy as an OpenAI-compatible Ray Serve deployment: the demos and CI take the Serve path a GPU
run takes (HTTP proxy, request router, replicas), with the policy in place of an engine.

Stateless: a policy finds its task from the rollout identity each request carries (``metadata.task_id``, looked
up in the run's dataset, then among the tasks a trainer's call posted: ``task_board``) and its turn from the
conversation, so any replica can answer any turn. The routes are the scripted server's
(``cluster.serving.scripted_server.routes``): ``POST /v1/chat/completions`` (faults included; ``stream: true``
answered as a streaming response of server-sent events), ``POST /v1/completions``, ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``, ``POST /v1/sessions/release``; anything else is an OpenAI-shaped 404.
Every reply names its replica in ``x-serve-replica`` (routing tests and ``bench_serve`` read it). With a key
(``serve.api_key``, or the one generated when Serve's proxy listens beyond loopback) a request through the proxy
without ``Authorization: Bearer <key>`` is a 401; a call through a ``DeploymentHandle`` needs none.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator

from pydantic import BaseModel

from cluster.names import POLICIES
from cluster.serving.apps import ServedModel
from cluster.serving.config import ServeSection
from cluster.serving.controls import ScriptedControls
from cluster.serving.handle_model import HandleModel
from cluster.serving.kinds.base import ServeApp, app_path, refused
from cluster.serving.scripted_server.config import FaultsConfig, ScriptedServerConfig
from cluster.serving.scripted_server.routes import ScriptedRoutes
from cluster.serving.task_board import BoardTasks, clear_tasks, post_tasks
from rollout.access import Keys
from rollout.config.load import validate
from rollout.models.client.model import OpenAIModel
from rollout.records import Task

DEPLOYMENT = "ScriptedPolicyServer"
"""The scripted app's one deployment (its ingress)."""


class ScriptedPolicyServer:
    def __init__(self, server_config: dict[str, Any], keys: Keys | None = None):
        from ray import serve

        self.keys = keys
        """The keys a request through Serve's HTTP proxy needs one of (None: none); ``post`` (a handle's call) needs
        none."""
        self.server = ScriptedRoutes(ScriptedServerConfig.model_validate(server_config))
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        # a trainer's tasks, posted by the farm for this application (the dataset's come first)
        self.server.model.tasks = BoardTasks(context.app_name, self.server.model.tasks)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse

        refusal = refused(request, self.keys)
        if refusal is not None:
            return refusal
        reply = await self.server.route(request.method, app_path(request), await request.body(),
                                        request.headers.get("x-rollout-id", ""))
        headers = {**(reply.headers or {}), "x-serve-replica": self.replica}
        if reply.events is None:
            return Response(b"".join(reply.chunks()), status_code=reply.status, headers=headers,
                            media_type=reply.media_type)
        headers["Cache-Control"] = "no-cache"
        return StreamingResponse(_each(reply.chunks()), status_code=reply.status, headers=headers,
                                 media_type=reply.media_type)

    async def post(self, path: str, body: bytes, rollout_id: str = "") -> tuple[int, dict[str, str], bytes]:
        """A POST to ``path`` (below the application's prefix) through a ``DeploymentHandle``, without the HTTP
        proxy: the reply's status, headers and body (a streamed reply's events joined)."""
        reply = await self.server.route("POST", path, body, rollout_id)
        return reply.status, {**(reply.headers or {}), "x-serve-replica": self.replica}, b"".join(reply.chunks())


async def _each(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def build(server_config: dict[str, Any], options: dict[str, Any], keys: Keys | None = None) -> Any:
    """The Serve application: ``server_config`` is a ``ScriptedServerConfig``'s fields, ``options`` deployment
    options, ``keys`` what its HTTP face requires (None: nothing)."""
    from ray import serve

    deployment = serve.deployment(ScriptedPolicyServer, name=DEPLOYMENT)
    return deployment.options(**options).bind(server_config, keys)


class ScriptedApp(ServeApp):
    """``app: scripted``: a scripted policy on Serve; with ``farm.backend: local``, the same policy in process."""

    scripted = True
    reads_dataset = True

    def preflight(self, section: ServeSection) -> None:
        validate(FaultsConfig, section.faults, prefix="serve.faults")
        POLICIES.load(section.policy, field="serve.policy")

    def build(self, section: ServeSection, model_id: str, options: dict[str, Any], *,
              dataset: str | None = None, keys: Keys | None = None) -> Any:
        options.setdefault("ray_actor_options", {}).setdefault("num_cpus", 0)  # the policy takes no rollout's CPU
        server_config = {"policy": POLICIES.resolve(section.policy), "latency": section.latency,
                         "faults": section.faults, "dataset": dataset, "model": model_id, "check_model": True}
        return build(server_config, options, keys)

    def controls(self, served: ServedModel) -> ScriptedControls:
        return ScriptedControls()

    def post_tasks(self, section: ServeSection, tasks: list[Task]) -> None:
        post_tasks(section.name, tasks)

    def clear_tasks(self, section: ServeSection) -> None:
        clear_tasks(section.name)

    def model_overrides(self, section: ServeSection, model_config: BaseModel) -> dict[str, Any]:
        # the sticky router frees a rollout's replica when told the rollout ended
        return {**super().model_overrides(section, model_config), "release_sessions": section.router == "sticky"}

    def inside_model(self, section: ServeSection, model: Any) -> HandleModel | None:
        # A Ray process skips the proxy: the replicas' ``post`` through a handle (the chat client's calls only; a
        # token-in client talks to /v1/completions and keeps the proxy for all of a rollout's calls)
        if not section.handle_calls or model.cls is not OpenAIModel or model.config.token_in:
            return None
        import ray
        from ray.util.client import ray as ray_client

        if not ray.is_initialized() or ray_client.is_connected():  # a Ray client (ray://) keeps the HTTP face
            return None
        return HandleModel(model.config, section.name, DEPLOYMENT, log_level=section.log_level)

    def in_process(self, section: ServeSection) -> dict[str, Any] | None:
        return {"policy": section.policy, "latency": section.latency, "faults": section.faults}
