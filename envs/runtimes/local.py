"""LocalRuntime: each command a fresh shell process on this host, in a workspace directory per rollout."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from envs.runtimes.host_files import read_host_file, write_host_file
from envs.runtimes.process import kill_group, run_capped
from rollout.config.load import StrictModel, coerce
from rollout.errors import ConfigError, ContainerStartError, RuntimeFailure
from rollout.protocols import ExecResult


class LocalRuntimeConfig(StrictModel):
    type: str = "local"
    """Registry short name of this runtime."""
    allow_host_exec: bool = False
    """Allow the model's commands to run directly on this host, unisolated. Off by default: set it on purpose."""
    root: str | None = None
    """Parent directory of the per-rollout workspaces; none: the system temp directory."""
    keep_workspace: bool = False
    """Leave the workspace on disk after ``close()`` (for debugging)."""
    shell: list[str] = Field(default_factory=lambda: ["bash", "-c"], min_length=1)
    """Argv the command string is appended to."""
    timeout: float = Field(30.0, gt=0)
    """Default per-command timeout in seconds; ``exec(timeout=...)`` overrides it."""
    max_output_bytes: int = Field(1_000_000, ge=1)
    """Combined stdout+stderr kept per command; past it the command is killed and ``truncated`` set."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every command, over the inherited ones."""
    inherit_env: bool = True
    """Start from this process's environment; off: only ``env`` (and per-call variables)."""


class LocalRuntime:
    """Runs ``shell + [command]`` per command, in its own process group so that a timeout, a full
    output buffer or the end of the command kills everything it started (background jobs included).
    Processes that start a new session themselves (``setsid``, daemons) escape the group."""

    def __init__(self, config: LocalRuntimeConfig | Mapping[str, Any] | None = None, *, trusted_model: bool = False):
        config = coerce(LocalRuntimeConfig, config, prefix="runtime")
        self.config = config
        self.trusted_model = trusted_model
        """Set by the composition layer when the model is the scripted model (its commands are ours)."""
        self.workspace: str | None = None
        self._closed = False
        self._base_env: dict[str, str] = {}
        self._running: set[int] = set()  # process group ids of commands in flight, killed on close()

    @classmethod
    def from_config(
        cls, config: LocalRuntimeConfig | Mapping[str, Any], *, trusted_model: bool = False
    ) -> LocalRuntime:
        return cls(config, trusted_model=trusted_model)

    @property
    def workdir(self) -> str | None:
        """Where commands run by default (the workspace), once started."""
        return self.workspace

    async def start(self) -> None:
        if self._closed:
            raise RuntimeFailure("LocalRuntime.start() after close()", retryable=False)
        if self.workspace is not None:
            return
        if not (self.config.allow_host_exec or self.trusted_model):
            raise ConfigError(
                "the local runtime runs the model's shell commands directly on this host, without isolation, "
                "so it refuses to start; set runtime.allow_host_exec=true to allow host execution "
                "(or use a container runtime)",
                "runtime.allow_host_exec",
            )
        try:
            if self.config.root:
                os.makedirs(self.config.root, exist_ok=True)
            self.workspace = tempfile.mkdtemp(prefix="rollout-ws-", dir=self.config.root)
        except OSError as exc:
            where = self.config.root or tempfile.gettempdir()
            raise ContainerStartError(f"cannot create a workspace under {where}: {exc}") from exc
        self._base_env = {**os.environ, **self.config.env} if self.config.inherit_env else dict(self.config.env)

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        workspace = self._check_open()
        workdir = os.path.join(workspace, cwd) if cwd else workspace  # an absolute cwd replaces the workspace
        if not os.path.isdir(workdir):
            # The model may have removed its own directory: that is a failing command, not a broken runtime.
            return ExecResult(output=f"cannot run the command in {workdir}: no such directory\n", returncode=1)
        ran = await run_capped(
            [*self.config.shell, command],
            timeout=self.config.timeout if timeout is None else timeout,
            max_output_bytes=self.config.max_output_bytes,
            cwd=workdir,
            env={**self._base_env, **env} if env else self._base_env,
            running=self._running,
            stdin=stdin,
        )
        if self._closed:
            raise RuntimeFailure("LocalRuntime was closed while the command ran")
        return ran

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to the workspace), creating parent directories."""
        target = os.path.join(self._check_open(), path)
        await asyncio.to_thread(write_host_file, target, bytes(data))

    async def read_file(self, path: str) -> bytes:
        """The bytes at ``path`` (relative to the workspace); ``FileNotFoundError`` if there is none."""
        target = os.path.join(self._check_open(), path)
        return await asyncio.to_thread(read_host_file, target)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in list(self._running):
            kill_group(pgid)
        if self.workspace is not None and not self.config.keep_workspace:
            await asyncio.to_thread(shutil.rmtree, self.workspace, ignore_errors=True)

    def _check_open(self) -> str:
        if self._closed:
            raise RuntimeFailure("LocalRuntime is closed")
        if self.workspace is None:
            raise RuntimeFailure("LocalRuntime used before start()", retryable=False)
        if not os.path.isdir(self.workspace):
            raise RuntimeFailure(f"the workspace {self.workspace} is gone")
        return self.workspace
