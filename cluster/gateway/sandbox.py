"""The model gateway a rollout's own sandbox reaches, started by the run itself for an agent that only speaks OpenAI
(``agents.external_agent`` without a ``gateway_url``): ``SandboxGateway``, a ``rollout.protocols.ModelGateway``.

Every worker process serves it on a unix socket of its own in the run's gateway directory on its node, which the
composition binds into each sandbox (``rollout.config.components.BindsPaths``). The sandbox keeps no network: its
agent reaches the socket through a forwarder on its own loopback (``agents.sandbox_forwarder``), and nothing else.
So the gateway is reachable from every node's containers without any address crossing machines, and a container
that can reach it reaches nothing else: not the Ray GCS, the dashboard, the Serve proxy, the agent server, the live
page, other containers or the host's ports.

Over the socket only two routes answer, and only with the rollout's key (``Authorization: Bearer <key>``, the
agent's ``OPENAI_API_KEY``): ``POST /rollouts/<id>/v1/chat/completions`` and ``GET /rollouts/<id>/v1/models``. A
missing key is a 401, a key of another rollout (or of an ended lease) a 403, an id with no lease a 404; every other
route is a 404. The recorded calls are read and forgotten in process (``calls``, ``close``), never over the socket,
so a harness cannot rewrite or erase what it did. Upstream, each call carries the rollout's whole identity
(``metadata``: rollout, task, sample, attempt, run), so a served policy finds its task and a sticky router its replica.

The upstream is the run's model URL, known once the run's model answers (``set_upstream``). The object pickles
before it starts (the composer ships it to the workers inside the agent); each process starts its own server on its
first lease.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web

from cluster.gateway.engine import Gateway, GatewayConfig
from cluster.gateway.replies import Reply, error_reply
from rollout.errors import ModelError
from rollout.protocols import GatewayLease
from rollout.records import RequestMeta
from rollout.wire.chat import request_metadata

INSIDE = "/run/rollout-gateway"
"""Where a container sees the run's gateway directory."""
MAX_BODY = 256 * 1024 * 1024
"""Largest request body over the socket (a long trajectory's messages)."""


def gateway_dir(token: str) -> str:
    """The run's gateway directory on every node (created by the first worker there that needs it)."""
    return os.path.join(tempfile.gettempdir(), "rollout-farm-gateway", token)


class SandboxGateway:
    """One worker process's gateway: the leases of its rollouts, its server per event loop, the calls recorded."""

    def __init__(self, directory: str, inside: str | None = None, upstream_base_url: str | None = None,
                 **options: Any):
        self.directory = directory
        """The gateway directory on this node."""
        self.inside = inside or directory
        """The same directory as the sandboxes see it (a bind's target; the directory itself on the host)."""
        self.upstream_base_url = upstream_base_url
        self.options = options
        """``GatewayConfig``'s other fields (timeout, max_calls_per_rollout, ...)."""
        self._reset()

    def _reset(self) -> None:
        self._gateway: Gateway | None = None
        self._servers: dict[asyncio.AbstractEventLoop, tuple[web.AppRunner, str]] = {}
        self._leases: dict[str, tuple[str, RequestMeta]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "inside": self.inside, "upstream_base_url": self.upstream_base_url,
                "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def set_upstream(self, base_url: str | None) -> None:
        """The run's model URL (an OpenAI base, ``http://host:port/v1``), once known; a later URL replaces it."""
        self.upstream_base_url = base_url
        if self._gateway is not None and base_url:
            self._gateway.upstream = base_url.rstrip("/")

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            if not self.upstream_base_url:
                raise ModelError("the model gateway has no upstream: the run's model has no URL yet", retryable=True)
            self._gateway = Gateway(GatewayConfig(upstream_base_url=self.upstream_base_url, **self.options))
        return self._gateway

    # ---- ModelGateway ------------------------------------------------------------------------------------------

    async def open(self, meta: RequestMeta) -> GatewayLease:
        rollout_id = meta.rollout_id
        if not rollout_id:
            raise ValueError("a gateway lease needs the rollout's id")
        gateway = self.gateway
        socket_name = await self._serve()
        gateway.store.forget(rollout_id)  # an earlier attempt's calls are not this one's
        key = "rk-" + secrets.token_urlsafe(32)
        self._leases[rollout_id] = (key, meta)
        return GatewayLease(rollout_id=rollout_id, socket=f"{self.inside.rstrip('/')}/{socket_name}",
                            path="/rollouts/" + quote(rollout_id, safe="") + "/v1", api_key=key)

    async def calls(self, rollout_id: str) -> dict[str, Any]:
        store = self.gateway.store
        return {"rollout_id": rollout_id, "dropped": store.dropped(rollout_id), "calls": store.calls(rollout_id)}

    async def close(self, rollout_id: str) -> None:
        self._leases.pop(rollout_id, None)
        if self._gateway is not None:
            self._gateway.store.forget(rollout_id)

    async def aclose(self) -> None:
        """Stop this process's servers (their sockets removed) and the upstream sessions."""
        for runner, name in list(self._servers.values()):
            await runner.cleanup()
            Path(self.directory, name).unlink(missing_ok=True)
        self._servers.clear()
        if self._gateway is not None:
            await self._gateway.aclose()

    # ---- the socket's side -------------------------------------------------------------------------------------

    async def _serve(self) -> str:
        """The socket's file name of this event loop's server, started on first use."""
        loop = asyncio.get_running_loop()
        if loop in self._servers:
            return self._servers[loop][1]
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        name = f"gateway-{os.getpid()}-{len(self._servers)}-{secrets.token_hex(4)}.sock"
        path = os.path.join(self.directory, name)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(r"/rollouts/{rollout_id:.+}/v1/chat/completions", self._chat)
        app.router.add_get(r"/rollouts/{rollout_id:.+}/v1/models", self._models)
        app.router.add_route("*", r"/{rest:.*}", self._unknown)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, path).start()
        os.chmod(path, 0o666)  # a sandbox's user need not be root; the key, not the file mode, guards it
        self._servers[loop] = (runner, name)
        return name

    def _refusal(self, request: web.Request) -> Reply | None:
        rollout_id = request.match_info["rollout_id"]
        lease = self._leases.get(rollout_id)
        if lease is None:
            return error_reply(f"no rollout {rollout_id!r} holds a lease on this gateway", 404, "NotFoundError")
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer ") or not given[7:].strip():
            return error_reply("this gateway needs the rollout's key (Authorization: Bearer $OPENAI_API_KEY)", 401,
                               "AuthenticationError")
        if not hmac.compare_digest(given[7:].strip().encode(), lease[0].encode()):
            return error_reply(f"this key is not rollout {rollout_id!r}'s", 403, "PermissionDeniedError")
        return None

    async def _chat(self, request: web.Request) -> web.Response:
        refused = self._refusal(request)
        if refused is not None:
            return _answer(refused)
        rollout_id = request.match_info["rollout_id"]
        meta = self._leases[rollout_id][1]
        version = {"policy_version": meta.policy_version} if meta.policy_version is not None else None
        return _answer(await self.gateway.chat_body(rollout_id, await request.read(), request_metadata(meta), version))

    async def _models(self, request: web.Request) -> web.Response:
        refused = self._refusal(request)
        return _answer(refused if refused is not None else await self.gateway.models(request.match_info["rollout_id"]))

    async def _unknown(self, request: web.Request) -> web.Response:
        return _answer(error_reply(f"{request.method} {request.path} is not a route of this gateway", 404,
                                   "NotFoundError"))


def _answer(reply: Reply) -> web.Response:
    return web.Response(body=reply.body, status=reply.status,
                        headers={"Content-Type": reply.media_type, "Cache-Control": "no-cache"})
