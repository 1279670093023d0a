"""The kinds of model tier a run's ``serve`` section names, as strategies, and the one table that finds them.

Each kind is a class beside what it serves (``scripted_app``, ``vllm_app``, ``subprocess_engine``, ``endpoint``)
answering the same questions: how many CPUs an embedded cluster needs for it, the Serve application it builds,
its RL controls, how a trainer's tasks reach it, what can be checked before anything deploys, and what it changes
in the client's model config. Nothing else branches on ``serve.app``: a new kind is one class plus one line of
``APPS`` (and, when it is a second engine of an existing ``app``, one line of ``ENGINES``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollout.registry import Registry

if TYPE_CHECKING:
    from cluster.serving.apps import ServedModel
    from cluster.serving.config import ServeSection

APPS = Registry("serve app", {
    "scripted": "cluster.serving.scripted_app:ScriptedApp",
    "vllm": "cluster.serving.vllm_app:VllmApp",
    "vllm-subprocess": "cluster.serving.subprocess_engine:SubprocessVllmApp",
    "endpoint": "cluster.serving.endpoint:EndpointApp",
})
ENGINES = {("vllm", "subprocess"): "vllm-subprocess"}
"""``(serve.app, serve.engine)`` pairs served by a kind of their own; any other pair is the ``app``'s kind."""


class ServeApp:
    """What every kind answers; the defaults are those of a kind that deploys a real model on Serve."""

    deploys = True
    """It deploys a Serve application (so it needs Ray); ``endpoint`` deploys nothing and talks to a URL."""
    scripted = False
    """Its outputs are scripted (no real model): runtimes that run commands on the host accept it."""
    reads_dataset = False
    """Its replicas read the run's dataset (a scripted policy finds its task there)."""

    def check(self, section: "ServeSection") -> str | None:
        """What is wrong with ``section`` for this kind (the config error's text), or None."""
        return None

    def preflight(self, section: "ServeSection") -> None:
        """Checks that need more than the section's own fields (files, the policy's import), before any work;
        raise ``ConfigError`` naming the field."""

    def cluster_cpus(self, section: "ServeSection", num_cpus: int | None) -> int | None:
        """Logical CPUs an embedded cluster needs for this kind (``farm.num_cpus`` given: that)."""
        return num_cpus

    def build(self, section: "ServeSection", model_id: str, options: dict[str, Any], *,
              dataset: str | None = None) -> Any:
        """The Serve application (``options``: the section's deployment options, router included)."""
        raise ValueError(f"serve.app {section.app!r} deploys nothing")

    def controls(self, served: "ServedModel") -> Any:
        """The RL controls of the deployed model (``cluster.serving.controls``)."""
        from cluster.serving.controls import EndpointControls

        return EndpointControls()

    def post_tasks(self, section: "ServeSection", tasks: list[Any]) -> None:
        """A trainer's call hands the farm ``tasks``: make them visible to the replicas (blocking)."""

    def clear_tasks(self, section: "ServeSection") -> None:
        """The farm closes: forget what ``post_tasks`` posted (blocking)."""

    def model_overrides(self, section: "ServeSection", model_config: Any) -> dict[str, Any]:
        """Fields of the client's model config this kind sets (a client without them gets none)."""
        return {}

    def inside_model(self, section: "ServeSection", model: Any) -> Any:
        """The run's workers' model for this application called from inside the cluster (``model``: the client's
        ``Component`` against the application's URL), or None to call it through Serve's HTTP proxy."""
        return None

    def in_process(self, section: "ServeSection") -> dict[str, Any] | None:
        """The in-process scripted server section that plays this kind without Ray (``farm.backend: local``), or
        None when only a Serve deployment can serve it."""
        return None


def kind_of(section: "ServeSection") -> str:
    """The ``APPS`` name of ``section``'s kind."""
    return ENGINES.get((section.app, section.engine), section.app)


def app_for(section: "ServeSection") -> ServeApp:
    """The strategy serving ``section``."""
    return APPS.load(kind_of(section), field="serve.app")()


def app_names() -> list[str]:
    """The values ``serve.app`` takes."""
    return sorted(set(APPS.names()) - set(ENGINES.values()))
