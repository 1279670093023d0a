"""The NeMo-Gym-compatible agent server over a run config's farm (``rollout gym serve``, ``cluster.cli.gym_serve``).

In this process (uvicorn on ``gym.host:gym.port``), or with ``gym.serve: true`` (``--serve``) as a Ray Serve
application whose replica holds the farm, behind Serve's HTTP proxy. Either way the rollouts run on the farm's
workers, and the model is the config's: a ``serve`` section is deployed first (the agent's replica is handed its
URL), or played in this process when it says ``in_process: true`` (a scripted policy). Prints the agent server's
URL, serves until Ctrl-C.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

from cluster.assembly import FarmAssembly
from cluster.config import ServeSection
from cluster.config.gym_section import GymSection, give_cleanup_timeout
from cluster.farm.rollout_farm import RolloutFarm
from cluster.gym.agent_app import EpisodeRunner, build_app
from rollout.access import token_for
from rollout.config.load import validate
from rollout.models.client.config import OpenAIModelConfig


def prepared(raw: dict[str, Any]) -> tuple[dict[str, Any], GymSection]:
    """The run config with the gym section's cleanup timeout given to its resources environments, and the
    section, its token the one the server requires (``gym.token``; generated here when ``gym.host`` is not
    loopback and none is set: keep it in ``raw["gym"]`` for the next call). Needs no dataset."""
    raw = copy.deepcopy(raw)
    settings = validate(GymSection, raw.pop("gym", None) or {}, prefix="gym")
    settings = settings.model_copy(update={"token": token_for(settings.host, settings.token)})
    raw.setdefault("dataset", {"path": "-"})
    give_cleanup_timeout(raw, settings.cleanup_timeout)
    return raw, settings


def build(raw: dict[str, Any], out: Any = sys.stderr) -> tuple[Any, Any]:
    """(the started farm, the agent server's app) for a run config."""
    raw, settings = prepared(raw)
    farm = RolloutFarm.from_config(raw, name=f"gym-{os.getpid()}", out=out).start()
    return farm, build_app(EpisodeRunner(farm, settings), gateway=_gateway(settings, farm, raw))


def _gateway(settings: GymSection, farm: RolloutFarm, raw: dict[str, Any]) -> Any:
    """The per-rollout model gateway's router, in front of ``gym.gateway`` or the run's model URL (None: no URL)."""
    upstream = settings.gateway or farm.source.base_url  # a scripted server's or Serve model's
    upstream = upstream or (raw.get("model") or {}).get("base_url")
    if not upstream:
        return None
    try:
        from cluster.gym.gateway import gateway_router  # aiohttp, the gateway's client: optional
    except ImportError:
        return None
    model = farm.source.composer.model_component.config
    own = settings.gateway is None and isinstance(model, OpenAIModelConfig)
    return gateway_router(upstream, api_key=model.api_key if own else None)  # the run's model's face may need its key


class AgentServerDeployment:
    """The Serve replica: builds the farm and the app from the run config when it starts."""

    _farm: RolloutFarm | None = None
    """The replica's farm, once built (``__del__`` may run on a replica whose ``__init__`` failed)."""

    def __init__(self, raw: dict[str, Any]):
        self._farm, self._asgi = build(raw)  # (``app`` is Serve's own attribute of an ingress class)

    def __serve_build_asgi_app__(self) -> Any:
        return self._asgi

    def __del__(self) -> None:
        farm = self._farm
        if farm is not None:
            farm.close()


def deploy(assembly: FarmAssembly, raw: dict[str, Any], settings: GymSection, name: str = "rollout-gym") -> str:
    """Deploy the agent server as a Serve application on ``assembly``'s cluster (``assembly.stop_ingress`` deletes
    it); its URL."""
    asked = {key: getattr(settings, key) for key in ("host", "port") if key in settings.model_fields_set}
    return assembly.open_ingress(AgentServerDeployment, raw, name=name, deployment="AgentServer", host=settings.host,
                                 port=settings.port or None, asked=asked, route_prefix=settings.route_prefix,
                                 max_ongoing_requests=max(1000, settings.max_concurrent_episodes or 0) * 2)


def open_model(raw: dict[str, Any], address: str | None) -> FarmAssembly:
    """The agent server's cluster joined and the config's ``serve`` model deployed before the agent server (its
    replica gets the URL, and the config its model section rewritten to it)."""
    section = raw.get("serve") or (raw.get("model") or {}).get("serve")
    section = validate(ServeSection, section, prefix="serve") if section else None
    model = raw.get("model") or {}
    assembly = FarmAssembly(section, model=model, address=address or os.environ.get("RAY_ADDRESS"),
                            num_cpus=(raw.get("farm") or {}).get("num_cpus"), backend="ray")
    served = assembly.open_model()
    if served is not None:
        raw.pop("serve", None)
        model = {k: v for k, v in model.items() if k != "serve"}
        raw["model"] = {**model, "base_url": served.base_url, "model": served.model_id}
        if served.api_key:  # the key of the model's face (serve.api_key, or generated): the replica's client sends it
            raw["model"]["api_key"] = served.api_key
    return assembly
