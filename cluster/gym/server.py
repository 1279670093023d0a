"""``rollout gym serve CONFIG [key=value ...]``: the NeMo-Gym-compatible agent server over a run config's farm.

In this process (uvicorn on ``gym.host:gym.port``), or with ``gym.serve: true`` (``--serve``) as a Ray Serve
application whose replica holds the farm, behind Serve's HTTP proxy. Either way the rollouts run on the farm's
workers, and the model is the config's: a ``serve`` section is deployed first (the agent's replica is handed its
URL), a ``fake_server`` starts with the farm. Prints the agent server's URL, serves until Ctrl-C.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import threading
from typing import Any

from cluster.cli.parser import HelpParser
from cluster.gym.config import GymSection, give_cleanup_timeout


def prepared(raw: dict[str, Any]) -> tuple[dict[str, Any], GymSection]:
    """The run config with the gym section's cleanup timeout given to its resources environments, and the
    section. Needs no dataset."""
    from rollout.config.load import validate

    raw = copy.deepcopy(raw)
    settings = validate(GymSection, raw.pop("gym", None) or {}, prefix="gym")
    raw.setdefault("dataset", {"path": "-"})
    give_cleanup_timeout(raw, settings.cleanup_timeout)
    return raw, settings


def build(raw: dict[str, Any], out: Any = sys.stderr) -> tuple[Any, Any]:
    """(the started farm, the agent server's app) for a run config."""
    from cluster.farm.rollout_farm import RolloutFarm
    from cluster.gym.agent_app import EpisodeRunner, build_app

    raw, settings = prepared(raw)
    farm = RolloutFarm.from_config(raw, name=f"gym-{os.getpid()}", out=out).start()
    return farm, build_app(EpisodeRunner(farm, settings), gateway=_gateway(settings, farm, raw))


def _gateway(settings: GymSection, farm: Any, raw: dict[str, Any]) -> Any:
    """The per-rollout model gateway's router, in front of ``gym.gateway`` or the run's model URL (None: no URL)."""
    upstream = settings.gateway or getattr(farm.source, "base_url", None)  # a scripted server's or Serve model's
    upstream = upstream or (raw.get("model") or {}).get("base_url")
    if not upstream:
        return None
    try:
        from cluster.gym.gateway import gateway_router
    except ImportError:
        return None
    return gateway_router(upstream)


class AgentServerDeployment:
    """The Serve replica: builds the farm and the app from the run config when it starts."""

    def __init__(self, raw: dict[str, Any]):
        self._farm, self._asgi = build(raw)  # (``app`` is Serve's own attribute of an ingress class)

    def __serve_build_asgi_app__(self) -> Any:
        return self._asgi

    def __del__(self) -> None:
        farm = getattr(self, "_farm", None)
        if farm is not None:
            farm.close()


def deploy(raw: dict[str, Any], settings: GymSection, name: str = "rollout-gym") -> str:
    """Deploy the agent server as a Serve application; its URL."""
    from ray import serve

    from cluster.serving.apps import free_port, proxy_url
    from cluster.session.serve_instance import quiet_reconnects, start_serve

    asked = {key: getattr(settings, key) for key in ("host", "port") if key in settings.model_fields_set}
    start_serve(settings.host, settings.port or free_port(settings.host), asked=asked,
                logging_config={"log_level": "WARNING", "enable_access_log": False})
    deployment = serve.deployment(serve.ingress()(AgentServerDeployment), name="AgentServer",
                                  max_ongoing_requests=max(1000, settings.max_concurrent_episodes or 0) * 2,
                                  ray_actor_options={"num_cpus": 0})
    with quiet_reconnects():
        serve.run(deployment.bind(raw), name=name, route_prefix=settings.route_prefix, blocking=False)
    return proxy_url() + settings.route_prefix.rstrip("/")


def _assembly(raw: dict[str, Any], address: str | None) -> Any:
    """The agent server's cluster joined and the config's ``serve`` model deployed before the agent server (its
    replica gets the URL, and the config its model section rewritten to it)."""
    from cluster.assembly import FarmAssembly
    from cluster.serving.config import ServeSection
    from rollout.config.load import validate

    section = raw.get("serve") or (raw.get("model") or {}).get("serve")
    section = validate(ServeSection, section, prefix="serve") if section else None
    model = raw.get("model") or {}
    assembly = FarmAssembly(section, model=model, address=address or os.environ.get("RAY_ADDRESS"),
                            num_cpus=(raw.get("farm") or {}).get("num_cpus"), backend="ray").join()
    served = assembly.start_model()
    if served is not None:
        raw.pop("serve", None)
        model = {k: v for k, v in model.items() if k != "serve"}
        raw["model"] = {**model, "base_url": served.base_url, "model": served.model_id}
    return assembly


def serve_main(argv: list[str]) -> int:
    parser = HelpParser(prog="rollout gym serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", metavar="CONFIG|key=value")
    parser.add_argument("--host", default=None, help="interface (default gym.host: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default gym.port: 8000)")
    parser.add_argument("--serve", action="store_true", help="run as a Ray Serve application (gym.serve)")
    parser.add_argument("--address", default=None, help="Ray cluster to join (default $RAY_ADDRESS, else embedded)")
    args = parser.parse_args(argv)
    from rollout.config.load import load_config
    from rollout.errors import ConfigError

    try:
        raw = load_config([i for i in args.items if "=" not in i], [i for i in args.items if "=" in i])
        gym = dict(raw.get("gym") or {})
        gym.update({k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None})
        if args.serve:
            gym["serve"] = True
        raw["gym"] = gym
        if args.address:
            raw.setdefault("farm", {})["address"] = args.address
        _, settings = prepared(raw)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    if settings.serve:
        assembly = _assembly(raw, args.address)
        url = deploy(raw, settings)
        print(url, flush=True)
        _wait(stop)
        from ray import serve

        serve.delete("rollout-gym")
        assembly.stop_model()
        return 0
    from envs.resources.serving import BackgroundServer

    farm, app = build(raw)
    server = BackgroundServer(app, settings.host, settings.port).start()
    print(server.url, flush=True)
    try:
        _wait(stop)
    finally:
        server.stop()
        farm.close()
    return 0


def _wait(stop: threading.Event) -> None:
    # Our own handlers: Ray's driver replaces Python's SIGINT handler, so Ctrl-C would not raise here.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print("serving until interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    while not stop.wait(3600):
        pass
