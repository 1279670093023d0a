"""Every use of Ray's private APIs, in one place: Ray 2.60 has no public way to do these. ``SYMBOLS`` lists what is
reached, and ``tests/cluster/session/test_ray_private.py`` fails, naming it, the day a Ray upgrade moves one. Each
function imports what it reaches of Ray itself: the session, and the farm with it, imports without Ray."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

SYMBOLS = (
    ("ray.experimental.internal_kv", "_internal_kv_put"),
    ("ray.experimental.internal_kv", "_internal_kv_get"),
    ("ray.experimental.internal_kv", "_internal_kv_del"),
    ("ray.experimental.internal_kv", "_internal_kv_list"),
    ("ray.serve.context", "_get_global_client"),
    ("ray.llm._internal.serve.core.ingress.dev_ingress", "build_dev_openai_app"),
    ("ray.llm._internal.serve.core.ingress.dev_ingress", "DevIngress"),
    ("ray.llm._internal.serve.core.ingress.dev_ingress", "DEV_ENDPOINTS"),
    ("ray.llm._internal.serve.core.ingress.ingress", "OpenAiIngress"),
    ("ray.llm._internal.serve.core.ingress.ingress", "DEFAULT_ENDPOINTS"),
    ("ray.llm._internal.serve.core.ingress.ingress", "make_fastapi_ingress"),
    ("ray.llm._internal.serve.core.configs.openai_api_models", "to_model_metadata"),
    ("ray.llm._internal.serve.core.server.builder", "build_llm_deployment"),
    ("ray.llm._internal.serve.core.server.llm_server", "LLMServer"),
    ("ray.llm._internal.serve.core.protocol", "RawRequestInfo"),
    ("ray.serve._private.http_util", "session_id_from_headers"),
    ("ray._raylet", "AuthenticationMode"),
    ("ray._raylet", "get_authentication_mode"),
    ("ray._private.services", "canonicalize_bootstrap_address"),
    ("ray._private.grpc_utils", "init_grpc_channel"),
    ("ray.core.generated.gcs_service_pb2", "GetClusterIdRequest"),
    ("ray.core.generated.gcs_service_pb2_grpc", "NodeInfoGcsServiceStub"),
    ("ray._common.utils", "get_ray_address_file"),
    ("ray._private.utils", "read_ray_address"),
    ("ray._private.worker", "_global_node"),
    ("ray._private.authentication.authentication_token_setup", "maybe_enable_token_auth_if_token_available"),
)
"""(module, attribute) of every private name used, for the test that watches them."""


# ---- the cluster's key-value store (the scripted app's task board, subprocess engines' URLs) ------------------------


def kv_put(key: str | bytes, value: bytes) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True)


def kv_get(key: str | bytes) -> bytes | None:
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(key)


def kv_del(key: str | bytes) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key)


def kv_keys(prefix: str) -> list[bytes]:
    from ray.experimental import internal_kv

    return list(internal_kv._internal_kv_list(prefix))


# ---- Serve ----------------------------------------------------------------------------------------------------------


def serve_running() -> bool:
    """Whether Serve (its controller) runs on the connected cluster, without starting it."""
    from ray.serve.context import _get_global_client

    return _get_global_client(raise_if_no_controller_running=False) is not None


def serve_details(timeout: float) -> dict[str, Any]:
    """Serve's instance details (applications, their deployments' target and replicas by id, state and node, and
    their recently dead replicas), waited for at most ``timeout`` seconds (``ray.exceptions.GetTimeoutError``)."""
    import ray
    from ray.serve.context import _get_global_client

    return ray.get(_get_global_client()._controller.get_serve_instance_details.remote(), timeout=timeout)


def serve_http_config() -> Any:
    """The HTTP options Serve's proxy runs with (host, port) on the connected cluster."""
    import ray
    from ray.serve.context import _get_global_client

    return ray.get(_get_global_client()._controller.get_http_config.remote())


def head_node_address() -> str:
    """The head node's address, where Serve always runs a proxy (its fallback proxy)."""
    import ray

    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


def dev_openai_app(config: Any) -> Any:
    """Ray Serve LLM's development ingress (the OpenAI routes plus the engine control routes), for ``config``."""
    from ray.llm._internal.serve.core.ingress.dev_ingress import build_dev_openai_app

    return build_dev_openai_app({"llm_configs": [config]})


def extended_openai_app(config: Any, *, controls: bool, server_mixin: type, ingress_mixin: type,
                        routes: dict[str, Any]) -> Any:
    """Ray Serve LLM's OpenAI app for one model (``controls``: its development ingress, with the engine control
    routes), what ``build_dev_openai_app`` / ``build_openai_app`` build, with the model's ``LLMServer`` and the
    ingress each extended by a mixin, and ``routes`` (method name -> FastAPI route decorator) added to the ingress."""
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.llm._internal.serve.core.ingress.dev_ingress import DEV_ENDPOINTS, DevIngress
    from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS, OpenAiIngress, make_fastapi_ingress
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    base, endpoints = (DevIngress, DEV_ENDPOINTS) if controls else (OpenAiIngress, DEFAULT_ENDPOINTS)
    server = build_llm_deployment(config, deployment_cls=type(f"{server_mixin.__name__}LLMServer",
                                                               (server_mixin, LLMServer), {}))
    ingress = make_fastapi_ingress(type(f"{ingress_mixin.__name__}{base.__name__}", (ingress_mixin, base), {}),
                                   endpoint_map={**endpoints, **routes})
    options = base.get_deployment_options([config])
    logging_config = (config.deployment_config or {}).get("logging_config")
    if logging_config is not None:  # the ingress logs as the model's deployment does (no access line per request)
        options.setdefault("logging_config", logging_config)
    return serve.deployment(ingress, **options).bind(
        llm_deployments={config.model_id: server}, model_cards={config.model_id: to_model_metadata(config.model_id,
                                                                                                   config)},
        lora_paths={})


def session_from_headers(headers: Any) -> str | None:
    """The session id a request names, read as Serve's proxy reads it (its configured header, any spelling)."""
    from ray.serve._private.http_util import session_id_from_headers

    return session_id_from_headers(headers)


def raw_request_info(request: Any) -> Any:
    """What Ray Serve LLM passes of an HTTP request to a model's replica (its headers)."""
    from ray.llm._internal.serve.core.protocol import RawRequestInfo

    return RawRequestInfo.from_starlette_request(request)


def starlette_request(info: Any) -> Any:
    """The request a replica rebuilds from ``raw_request_info`` (None for None)."""
    from ray.llm._internal.serve.core.protocol import RawRequestInfo

    return RawRequestInfo.to_starlette_request_optional(info)


def vllm_engine_parts(server: Any) -> tuple[Any, Any]:
    """(vLLM's engine client, vLLM's app state: its serving objects) of an ``LLMServer`` replica's engine, which
    Ray Serve LLM keeps in private attributes of its ``VLLMEngine``."""
    return server.engine._engine_client, server.engine._app_state


# ---- authentication and the GCS -------------------------------------------------------------------------------------


def token_auth_on() -> bool | None:
    """Whether this process's Ray runs with token authentication; None when this Ray cannot say."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except (ImportError, AttributeError):
        return None
    return get_authentication_mode() == AuthenticationMode.TOKEN


def enable_token_auth_if_available() -> None:
    """What ``ray.init("auto")`` does first: token authentication on when a token is at hand and RAY_AUTH_MODE is
    unset (nothing with a Ray that has no such step)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def address_file_for(target: str) -> str | None:
    """The address file ``ray start`` wrote on this machine when the address in it is ``target``, else None."""
    from ray._common.utils import get_ray_address_file
    from ray._private import services
    from ray._private.utils import read_ray_address

    written = read_ray_address()  # by the last `ray start` on this machine, and never removed if it was killed
    try:
        if written and services.canonicalize_bootstrap_address(written) == target:
            return get_ray_address_file(None)
    except ValueError:
        pass
    return None


def embedded_processes(kind: str) -> list[Any]:
    """The process records (``.process``: a Popen) of ``kind`` (``monitor``, ...) of the cluster this process
    started."""
    import ray

    node = getattr(getattr(ray, "_private", None) and ray._private.worker, "_global_node", None)
    return list((getattr(node, "all_processes", None) or {}).get(kind, []))


def gcs_probe_parts() -> tuple[ModuleType, Callable[..., Any], ModuleType, ModuleType] | None:
    """(services, init_grpc_channel, gcs_service_pb2, gcs_service_pb2_grpc) to ask a GCS for its cluster id as
    ``ray.init`` does; None with another Ray's internals."""
    try:
        from ray._private import services
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    return services, init_grpc_channel, gcs_service_pb2, gcs_service_pb2_grpc
