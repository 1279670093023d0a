"""Command lines of the apptainer/singularity CLI for one rollout's instance: start, exec (under the farm's resource
limits), stop."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envs.runtimes.apptainer.runtime import ApptainerRuntimeConfig


SEPARATE_MOUNT = "/rollout-workspace"
"""Where the workspace is bound when binding it at ``workdir`` could hide a directory of the image."""


def workspace_mount(config: ApptainerRuntimeConfig, image: str) -> str:
    """Where the workspace is bound for ``image`` (``config.workspace_mount``'s rule)."""
    if config.workspace_mount:
        return config.workspace_mount
    sandbox_lacks_workdir = os.path.isdir(image) and not os.path.lexists(os.path.join(image, config.workdir[1:]))
    return config.workdir if sandbox_lacks_workdir else SEPARATE_MOUNT


def start_argv(
    config: ApptainerRuntimeConfig, sif: str, name: str, workspace: str, binary: str | None = None,
    mount: str | None = None,
) -> list[str]:
    """``instance start`` with the isolation flags, the workspace bind (at ``mount``, by default
    ``workspace_mount(config, sif)``) and the limits from ``config``."""
    argv = [binary or config.binary or "apptainer", "instance", "start"]
    argv += ["--userns"] if config.userns else []
    argv += ["--containall"] if config.containall else []
    argv += ["--writable-tmpfs"] if config.writable_tmpfs else []
    argv += ["--no-home"] if config.no_home else []
    argv += ["--net", "--network", "none"] if config.network == "none" else []
    argv += ["--bind", f"{workspace}:{mount or workspace_mount(config, sif)}"]
    for spec in config.binds:
        argv += ["--bind", spec]
    argv += ["--memory", config.memory] if config.memory else []
    argv += ["--cpus", _seconds(config.cpus)] if config.cpus is not None else []
    argv += ["--pids-limit", str(config.pids_limit)] if config.pids_limit is not None else []
    return [*argv, *config.start_args, sif, name]


def exec_argv(
    config: ApptainerRuntimeConfig,
    name: str,
    command: str,
    *,
    timeout: float,
    pwd: str,
    env: Mapping[str, str] | None = None,
    binary: str | None = None,
    limits_inside: bool = True,
) -> list[str]:
    """``exec`` into the instance, the command under ``timeout`` so it is killed inside the container too, and under
    the farm's resource limits (``limits_argv``): set inside the container, on the command alone
    (``limits_inside``), or, for an image without ``prlimit``, on the CLI that execs it (``LIMITS_SAFE_OUTSIDE``).

    Variables go through coreutils ``env`` rather than ``--env``: the CLI parses ``--env`` values as
    CSV when they hold a second ``=`` and strips quotes around them, which would change some values.
    """
    variables = {**config.env, **(env or {})}
    limits = limits_argv(config)
    argv = [binary or config.binary or "apptainer", "exec", "--cleanenv", "--pwd", pwd, f"instance://{name}"]
    argv = [*argv, *limits] if limits_inside else [*limits, *argv]
    argv += ["timeout", "-k", _seconds(config.kill_grace), _seconds(timeout)]
    argv += ["env", *(f"{key}={value}" for key, value in variables.items())] if variables else []
    return [*argv, *config.shell, command]


LIMITS_SAFE_OUTSIDE = frozenset({"core", "cpu", "fsize", "memlock"})
"""The limits that may be set on apptainer's CLI when the image has no ``prlimit``: the CLI and its starter inherit
them too, and these bound nothing they need. The others do: under an address-space, data, process-count, open-file
or stack limit meant for the command, apptainer's Go runtime fails (``fatal error: out of memory`` when the node is
busy), and the command's output would be its crash."""


def resource_limits(config: ApptainerRuntimeConfig) -> dict[str, int | str]:
    """The resource limits set on each command, by ``setrlimit`` name: ``runtime.ulimits``, and ``max_file_size``
    as ``fsize`` unless the ulimits set it."""
    limits = dict(config.ulimits)
    if config.max_file_size is not None:
        limits.setdefault("fsize", config.max_file_size)
    return limits


def limits_argv(config: ApptainerRuntimeConfig) -> list[str]:
    """``prlimit --fsize=N:N ... --``: the resource limits the command runs under, where an unprivileged user has no
    cgroups; empty when none are set."""
    flags = []
    for name, value in sorted(resource_limits(config).items()):
        soft, _, hard = str(value).partition(":")
        flags.append(f"--{name}={_amount(soft)}:{_amount(hard or soft)}")
    return ["prlimit", *flags, "--"] if flags else []


def _amount(text: str) -> str:
    """``64m`` -> ``67108864`` (b, k, m, g binary units, as ``max_file_size`` takes them); numbers and
    ``unlimited`` as they are."""
    shift = {"b": 0, "k": 10, "m": 20, "g": 30}.get(text[-1:].lower())
    return str(int(text[:-1]) << shift) if shift is not None and text[:-1].isdigit() else text


def list_argv(binary: str, name: str) -> list[str]:
    """``instance list --json`` of one instance: its init's host pid among the fields."""
    return [binary, "instance", "list", "--json", name]


def stop_argv(binary: str, name: str) -> list[str]:
    # --force: SIGKILL at once; a rollout's sandbox holds nothing worth a graceful shutdown.
    return [binary, "instance", "stop", "--force", name]


def _seconds(value: float) -> str:
    """``1.0`` -> ``1``, ``0.25`` -> ``0.25``: what ``timeout`` and ``--cpus`` accept."""
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"
