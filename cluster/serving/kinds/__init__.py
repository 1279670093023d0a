"""The kinds of model tier a run's ``serve`` section names, as strategies, and the one table that finds them.

Each kind is a module of this package (``scripted``, ``vllm``, ``vllm_subprocess``, ``endpoint``): a ``ServeApp``
(``base``) answering the same questions: how many CPUs an embedded cluster needs for it, the Serve application it
builds, its RL controls, how a trainer's tasks reach it, what can be checked before anything deploys, and what it
changes in the client's model config. Nothing else branches on ``serve.app``: a new kind is one class plus one line
of ``APPS`` (and, when it is a second engine of an existing ``app``, one line of ``ENGINES``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.serving.kinds.base import ServeApp
from rollout.registry import Registry

if TYPE_CHECKING:  # the section's validators read this table
    from cluster.serving.config import ServeSection

__all__ = ["APPS", "ENGINES", "ServeApp", "app_for", "app_names", "kind_of"]

APPS = Registry("serve app", {
    "scripted": "cluster.serving.kinds.scripted:ScriptedApp",
    "vllm": "cluster.serving.kinds.vllm:VllmApp",
    "vllm-subprocess": "cluster.serving.kinds.vllm_subprocess:SubprocessVllmApp",
    "endpoint": "cluster.serving.kinds.endpoint:EndpointApp",
})
ENGINES = {("vllm", "subprocess"): "vllm-subprocess"}
"""``(serve.app, serve.engine)`` pairs served by a kind of their own; any other pair is the ``app``'s kind."""


def kind_of(section: ServeSection) -> str:
    """The ``APPS`` name of ``section``'s kind."""
    return ENGINES.get((section.app, section.engine), section.app)


def app_for(section: ServeSection) -> ServeApp:
    """The strategy serving ``section``."""
    return APPS.load(kind_of(section), field="serve.app")()


def app_names() -> list[str]:
    """The values ``serve.app`` takes."""
    return sorted(set(APPS.names()) - set(ENGINES.values()))
