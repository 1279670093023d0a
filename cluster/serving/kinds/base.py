"""``ServeApp``: what every kind of model tier answers, with the defaults of a kind that deploys a real model on
Serve; and ``app_path``, the request path a kind's replica answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from cluster.serving.controls import EndpointControls, ModelControls
from rollout.access import Keys, allowed, presented, refusal_body
from rollout.protocols import Model
from rollout.records import Task

if TYPE_CHECKING:  # both name their kind through the table (``kinds``), which names this class
    from cluster.serving.apps import ServedModel
    from cluster.serving.config import ServeSection


class ServeApp:
    """What every kind answers; the defaults are those of a kind that deploys a real model on Serve."""

    deploys = True
    """It deploys a Serve application (so it needs Ray); ``endpoint`` deploys nothing and talks to a URL."""
    scripted = False
    """Its outputs are scripted (no real model): runtimes that run commands on the host accept it."""
    reads_dataset = False
    """Its replicas read the run's dataset (a scripted policy finds its task there)."""

    def check(self, section: ServeSection) -> str | None:
        """What is wrong with ``section`` for this kind (the config error's text), or None."""
        return None

    def preflight(self, section: ServeSection) -> None:
        """Checks that need more than the section's own fields (files, the policy's import), before any work;
        raise ``ConfigError`` naming the field."""

    def cluster_cpus(self, section: ServeSection, num_cpus: int | None) -> int | None:
        """Logical CPUs an embedded cluster needs for this kind (``farm.num_cpus`` given: that)."""
        return num_cpus

    def build(self, section: ServeSection, model_id: str, options: dict[str, Any], *,
              dataset: str | None = None, keys: Keys | None = None) -> Any:
        """The Serve application (``options``: the section's deployment options, router included); ``keys``: what
        its HTTP face requires (``refused`` answers the rest), None for nothing."""
        raise ValueError(f"serve.app {section.app!r} deploys nothing")

    def url(self, section: ServeSection, base_url: str | None) -> str:
        """The API root of a kind that deploys nothing (``deploys`` false)."""
        raise ValueError(f"serve.app {section.app!r} deploys its own application: it has no URL of its own")

    def controls(self, served: ServedModel) -> ModelControls:
        """The RL controls of the deployed model (``cluster.serving.controls``)."""
        return EndpointControls()

    def post_tasks(self, section: ServeSection, tasks: list[Task]) -> None:
        """A trainer's call hands the farm ``tasks``: make them visible to the replicas (blocking)."""

    def clear_tasks(self, section: ServeSection) -> None:
        """The farm closes: forget what ``post_tasks`` posted (blocking)."""

    def model_overrides(self, section: ServeSection, model_config: BaseModel) -> dict[str, Any]:
        """Fields of the client's model config this kind sets (a client without them gets none): a kind that deploys
        gives the client the key of its face (``ServeSection.key``; a face on loopback ignores it)."""
        if self.deploys and "api_key" in type(model_config).model_fields:
            return {"api_key": section.key()}
        return {}

    def inside_model(self, section: ServeSection, model: Any) -> Model | None:
        """The run's workers' model for this application called from inside the cluster (``model``: the client's
        ``Component`` against the application's URL), or None to call it through Serve's HTTP proxy."""
        return None

    def in_process(self, section: ServeSection) -> dict[str, Any] | None:
        """The in-process scripted server section that plays this kind without Ray (``farm.backend: local``), or
        None when only a Serve deployment can serve it."""
        return None


def refused(request: Any, keys: Keys | None) -> Any:
    """A replica's 401 for a request (Starlette's) that carries none of ``keys`` (``rollout.access``), or None when it
    may pass: the check every kind's own HTTP entry makes (``vllm``'s ingress runs it as ``AccessGuard``)."""
    if allowed(presented(request.headers.get), keys):
        return None
    from starlette.responses import JSONResponse

    return JSONResponse(refusal_body("the model's HTTP face"), status_code=401, headers={"WWW-Authenticate": "Bearer"})


def app_path(request: Any) -> str:
    """A replica's request's path below the application's route prefix (``request``: Starlette's)."""
    path, root = request.scope["path"], request.scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path
