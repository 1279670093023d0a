"""Every use of Ray's private APIs, in one place: Ray 2.60 has no public way to do these. ``SYMBOLS`` lists what is
reached, and ``tests/cluster/session/test_ray_private.py`` fails, naming it, the day a Ray upgrade moves one."""

from __future__ import annotations

from typing import Any

SYMBOLS = (
    ("ray.experimental.internal_kv", "_internal_kv_put"),
    ("ray.experimental.internal_kv", "_internal_kv_get"),
    ("ray.experimental.internal_kv", "_internal_kv_del"),
    ("ray.experimental.internal_kv", "_internal_kv_list"),
    ("ray.serve.context", "_get_global_client"),
    ("ray.llm._internal.serve.core.ingress.dev_ingress", "build_dev_openai_app"),
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


def gcs_probe_parts() -> tuple[Any, Any, Any, Any] | None:
    """(services, init_grpc_channel, gcs_service_pb2, gcs_service_pb2_grpc) to ask a GCS for its cluster id as
    ``ray.init`` does; None with another Ray's internals."""
    try:
        from ray._private import services
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    return services, init_grpc_channel, gcs_service_pb2, gcs_service_pb2_grpc
