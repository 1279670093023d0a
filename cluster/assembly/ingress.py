"""An HTTP application of our own on Ray Serve, beside the model (the NeMo-Gym agent server with ``gym.serve``):
Serve started on the asked address, the class deployed as an ingress, and deleted again. The assembly's
``open_ingress``/``stop_ingress`` are the callers; nothing else calls ``serve.run`` or ``serve.delete``."""

from __future__ import annotations

from typing import Any

from cluster.serving.apps import free_port, proxy_url
from cluster.session.serve_instance import quiet_reconnects, start_serve


def deploy_ingress(cls: type, init_arg: Any, *, name: str, deployment: str, host: str, port: int | None,
                   asked: dict[str, Any], route_prefix: str, max_ongoing_requests: int) -> str:
    """Deploy ``cls(init_arg)`` (an ASGI ingress: ``__serve_build_asgi_app__``) as the deployment ``deployment`` of
    the Serve application ``name``, behind Serve's HTTP proxy (started on ``host:port``, any free port when None);
    its URL."""
    from ray import serve  # Ray is imported only where it is used: the rest of the assembly runs without it

    start_serve(host, port or free_port(host), asked=asked,
                logging_config={"log_level": "WARNING", "enable_access_log": False})
    ingress = serve.deployment(serve.ingress()(cls), name=deployment, max_ongoing_requests=max_ongoing_requests,
                               ray_actor_options={"num_cpus": 0})
    with quiet_reconnects():
        serve.run(ingress.bind(init_arg), name=name, route_prefix=route_prefix, blocking=False)
    return proxy_url() + route_prefix.rstrip("/")


def delete_ingress(name: str) -> None:
    from ray import serve

    serve.delete(name)
