"""``engine: subprocess``: each replica of a plain Serve deployment runs ``python -m
vllm.entrypoints.openai.api_server`` on a free port of its node and proxies every request to it — for where
``ray.serve.llm`` cannot place an engine (its placement group against vLLM's own Ray executor for tensor
parallelism). The replica's health check fails when the process has died, so Serve replaces the replica.

The engine runs with ``VLLM_SERVER_DEV_MODE=1`` (its control routes, for ``cluster.serving.controls``) and each
replica records its engine's URL in Ray's key-value store under ``ENGINE_KEY_PREFIX + app``, so the controls
reach every engine, not only the one a request happens to be routed to.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import aiohttp
from pydantic import BaseModel

from cluster.serving.apps import ServedModel
from cluster.serving.config import ServeSection
from cluster.serving.controls import EngineControls
from cluster.serving.kinds.base import ServeApp, app_path, refused
from cluster.serving.kinds.vllm import CPU_MEMORY_FRACTION, VllmApp
from cluster.session.ray_private import kv_del, kv_get, kv_keys, kv_put
from rollout.access import Keys
from rollout.wire.generate import GENERATE_PATH, with_placeholders

ENGINE_KEY_PREFIX = "rollout-farm/engines/"
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def engine_command(model_source: str, model_id: str, port: int, engine_kwargs: dict[str, Any]) -> list[str]:
    """The vLLM server's command line: engine arguments as flags (``True`` a bare flag, ``False`` left out,
    lists and mappings as JSON)."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_source,
               "--served-model-name", model_id, "--host", "127.0.0.1", "--port", str(port)]
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is False or value is None:
            continue
        else:
            command += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return command


class VllmProcessServer:
    def __init__(self, app: str, model_source: str, model_id: str, engine_kwargs: dict[str, Any],
                 ready_timeout: float, keys: Keys | None = None):
        self.keys = keys
        """The keys a request through Serve's proxy needs one of (None: none); the engine listens on 127.0.0.1."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tempfile.gettempdir(), f"rollout-farm-vllm-{self.port}.log")
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - the process writes to it for its whole life
        command = engine_command(model_source, model_id, self.port, engine_kwargs)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
        self._wait_ready(ready_timeout)
        from ray import serve

        self.key = f"{ENGINE_KEY_PREFIX}{app}/{serve.get_replica_context().replica_id.unique_id}"
        kv_put(self.key, self.url.encode())
        self.http: Any = None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm exited with {self.process.returncode} while starting; {self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"vllm did not answer within {timeout:g}s; {self._tail()}")

    def _tail(self) -> str:
        with open(self.log_path, "rb") as log:
            return "last lines of its log: " + log.read()[-2000:].decode("utf-8", "replace")

    def check_health(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the vllm process exited with {self.process.returncode}; {self._tail()}")

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        refusal = refused(request, self.keys)
        if refusal is not None:
            return refusal
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        target = self.url + app_path(request) + (f"?{request.url.query}" if request.url.query else "")
        async with self.http.request(request.method, target, data=await request.body(), headers=headers) as reply:
            body = await reply.read()
            kept = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}
            if reply.status == 200 and app_path(request) == GENERATE_PATH and body.startswith(b"{"):
                # the token_id:N placeholder earlier clients check (cluster/serving/generate_route.py)
                body = json.dumps(with_placeholders(json.loads(body))).encode()
                kept.pop("content-length", None)
            return Response(body, status_code=reply.status, headers=kept)

    process: subprocess.Popen | None = None
    """The ``vllm serve`` process, once started (``__del__`` may run on a replica whose ``__init__`` failed)."""
    key: str | None = None
    """Where its URL is recorded for the controls (Ray's KV store), once it is."""

    def __del__(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        key = self.key
        if key:
            try:
                kv_del(key)
            except Exception:  # noqa: BLE001 - the cluster may be going away
                pass


def build(section: ServeSection, model_id: str, options: dict[str, Any], keys: Keys | None = None) -> Any:
    kwargs = {"enable_scale_out": True, **section.engine_kwargs}  # vllm serve mounts /inference/v1/generate then
    if section.cpu:
        kwargs.setdefault("gpu_memory_utilization", CPU_MEMORY_FRACTION)
    from ray import serve

    options = {**options, "health_check_period_s": options.get("health_check_period_s", 5)}
    options.setdefault("ray_actor_options", {}).setdefault("num_cpus", 1)
    deployment = serve.deployment(VllmProcessServer, name="VllmProcessServer")
    return deployment.options(**options).bind(section.name, section.model_source, model_id, kwargs,
                                              section.ready_timeout, keys)


def engine_urls(app: str) -> list[str]:
    """The engine URLs the replicas of application ``app`` recorded (on the connected cluster)."""
    values = [kv_get(k) for k in kv_keys(f"{ENGINE_KEY_PREFIX}{app}/")]
    return sorted(v.decode() for v in values if v)


class SubprocessVllmApp(VllmApp):
    """``app: vllm`` with ``engine: subprocess``: a ``vllm serve`` process per replica behind a proxy deployment."""

    def build(self, section: ServeSection, model_id: str, options: dict[str, Any], *,
              dataset: str | None = None, keys: Keys | None = None) -> Any:
        return build(section, model_id, options, keys)

    def controls(self, served: ServedModel) -> EngineControls:
        return EngineControls(functools.partial(engine_urls, served.section.name), served.model_id,
                              flavour="vllm", cpu=served.section.cpu)

    def model_overrides(self, section: ServeSection, model_config: BaseModel) -> dict[str, Any]:
        return {**ServeApp.model_overrides(self, section, model_config), "release_sessions": False, "cache_salt": True}
