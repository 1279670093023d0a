"""Command lines of the apptainer/singularity CLI for one rollout's instance: start, exec, stop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envs.runtimes.apptainer.runtime import ApptainerRuntimeConfig


def start_argv(
    config: ApptainerRuntimeConfig, sif: str, name: str, workspace: str, binary: str | None = None
) -> list[str]:
    """``instance start`` with the isolation flags, the workspace bind and the limits from ``config``."""
    argv = [binary or config.binary or "apptainer", "instance", "start"]
    argv += ["--containall"] if config.containall else []
    argv += ["--writable-tmpfs"] if config.writable_tmpfs else []
    argv += ["--no-home"] if config.no_home else []
    argv += ["--net", "--network", "none"] if config.network == "none" else []
    argv += ["--bind", f"{workspace}:{config.workspace_mount or config.workdir}"]
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
) -> list[str]:
    """``exec`` into the instance, the command under ``timeout`` so it is killed inside the container too.

    Variables go through coreutils ``env`` rather than ``--env``: the CLI parses ``--env`` values as
    CSV when they hold a second ``=`` and strips quotes around them, which would change some values.
    """
    variables = {**config.env, **(env or {})}
    argv = [binary or config.binary or "apptainer", "exec", "--cleanenv", "--pwd", pwd, f"instance://{name}"]
    argv += ["timeout", "-k", _seconds(config.kill_grace), _seconds(timeout)]
    argv += ["env", *(f"{key}={value}" for key, value in variables.items())] if variables else []
    return [*argv, *config.shell, command]


def stop_argv(binary: str, name: str) -> list[str]:
    # --force: SIGKILL at once; a rollout's sandbox holds nothing worth a graceful shutdown.
    return [binary, "instance", "stop", "--force", name]


def _seconds(value: float) -> str:
    """``1.0`` -> ``1``, ``0.25`` -> ``0.25``: what ``timeout`` and ``--cpus`` accept."""
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"
