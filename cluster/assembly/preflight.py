"""Checks that can fail before any work starts: runtime permissions, the cluster to join, model reachability, the
scripted server.

Each raises ``ConfigError`` naming the field, so a run that could only fail every rollout exits 2 before its
run directory is written, instead of recording a run of infrastructure failures.
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlsplit

from cluster.compose import Composer
from cluster.config.run_config import RunConfig
from cluster.serving.kinds import app_for
from cluster.session.connect import join_address
from cluster.session.join_check import check_join
from envs.images.registry import check_registry as registry_answers
from rollout.config.components import EndpointModelConfig, RunsOnHost
from rollout.errors import ConfigError
from rollout.records import Task

CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a TCP connection to the model endpoint."""


def check(config: RunConfig, composer: Composer, tasks: list[Task]) -> None:
    """Every pre-flight check, cheapest first (``check_serve``, the model kind's own, ran earlier, before the
    dataset loads)."""
    check_runtime_permissions(composer, tasks)
    check_cluster(config)
    check_registry(config)
    check_model_reachable(config, composer)


def check_registry(config: RunConfig) -> None:
    """``images.registry`` answers and takes this machine's credentials: a wrong one is one error, before work."""
    if config.images.registry and config.farm.backend == "ray":
        registry_answers(config.images.registry)


def check_serve(config: RunConfig) -> None:
    """The model kind's own checks (a scripted app's policy and faults, a vLLM app's local model directory), before
    anything deploys."""
    section = config.serve
    if section is not None:
        app_for(section).preflight(section)


def check_runtime_permissions(composer: Composer, tasks: list[Task]) -> None:
    """A runtime that runs commands on this host (``allow_host_exec: false``) refuses a model that is not
    scripted: at run time every rollout would fail the same way, so say it now."""
    if composer.trusted_model:
        return
    in_use = {task.data.get("profile") for task in tasks} or {None}
    for name in sorted(in_use, key=lambda n: (n is not None, n or "")):
        runtime = composer.profiles[name].runtime
        if runtime is None or not isinstance(runtime.config, RunsOnHost) or runtime.config.allow_host_exec:
            continue
        prefix = f"profiles.{name}." if name is not None and composer.config.profiles[name].runtime else ""
        raise ConfigError(
            f"the {runtime.config.type} runtime runs the model's shell commands on this host without isolation "
            "and the model is not scripted; set it to true to allow that, or use a container runtime",
            f"{prefix}runtime.allow_host_exec",
        )


def check_cluster(config: RunConfig) -> None:
    """The cluster a run joins (``farm.address`` / ``--address``, else ``$RAY_ADDRESS``) answers and takes this
    process's authentication token (``cluster.session.join_check``). A run that starts its own has nothing to check."""
    if config.farm.backend != "ray" or not (config.farm.address or os.environ.get("RAY_ADDRESS")):
        return
    import ray  # only a run on the ray backend gets here

    if not ray.is_initialized():  # a process already on a cluster runs there (``connect``)
        check_join(*join_address(config.farm.address))


def check_model_reachable(config: RunConfig, composer: Composer) -> None:
    """A TCP connection to the model endpoint's ``base_url``. Skipped when the run serves its own scripted server,
    and through a Ray client (``ray://``): that driver is off the cluster, whose nodes may reach an endpoint
    (a Serve proxy on each node's localhost) that this machine cannot."""
    address = config.farm.address or os.environ.get("RAY_ADDRESS") or ""
    if config.played_here is not None or (config.farm.backend == "ray" and address.startswith("ray://")):
        return
    if config.deployed is not None and app_for(config.deployed).deploys:
        return  # deployed when the run starts
    model = composer.model_component.config
    url, field = model.base_url if isinstance(model, EndpointModelConfig) else None, "model.base_url"
    if config.serve is not None and config.serve.base_url:  # app: endpoint names its URL itself
        url, field = config.serve.base_url, "serve.base_url"
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot reach {url} ({_reason(exc)}); start the model server or fix the URL",
                          field) from None


def _reason(exc: Any) -> str:
    if isinstance(exc, socket.timeout):
        return f"no connection within {CONNECT_TIMEOUT:g}s"
    return exc.strerror or type(exc).__name__
