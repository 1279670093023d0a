"""ApptainerRuntime: one apptainer/singularity instance per rollout, driven through its CLI, a host directory bound in."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from envs.runtimes.apptainer_argv import exec_argv, start_argv, stop_argv  # noqa: F401 - re-exported
from envs.runtimes.host_files import read_host_file, write_host_file
from envs.images.apptainer_images import ensure_sif, find_binary
from envs.runtimes.process import failure_reason, kill_group, run_capped
from rollout.config import StrictModel, validate
from rollout.errors import ContainerStartError, RuntimeFailure
from rollout.protocols import ExecResult

_CONTROL_CAP = 1 << 20
"""Output kept from instance start/stop commands (only their tail is ever shown)."""
_TAIL = 2000


class ApptainerRuntimeConfig(StrictModel):
    type: str = "apptainer"
    """Registry short name of this runtime."""
    binary: str | None = None
    """The CLI to drive (a name on PATH or a path); none: the first of apptainer, singularity on PATH."""
    image: str = "docker-daemon:rollout-farm/base:bookworm"
    """A local image (.sif or sandbox directory), or a reference (``docker-daemon:<ref>``, ``docker://<ref>``,
    ...) converted once into ``cache_dir``; delete the cached .sif to pick up a rebuilt docker image."""
    cache_dir: str | None = None
    """Where converted images live; none: ``$ROLLOUT_HOME/.apptainer-cache``, else the XDG cache directory."""
    workdir: str = "/workspace"
    """Where commands run by default, in the container; relative ``cwd`` and file paths are relative to it."""
    workspace_mount: str | None = None
    """Where the per-rollout host directory is bound in the container; none: at ``workdir``. Set it elsewhere
    when ``workdir`` is a directory the image provides (``/testbed``), which a bind would hide."""
    workspace_root: str | None = None
    """Parent directory of the per-rollout host directories; none: the system temp directory."""
    keep_workspace: bool = False
    """Leave the host directory on disk after ``close()`` (for debugging)."""
    network: Literal["none", "host"] = "none"
    """``none``: loopback only (``--net --network none``; unprivileged users need apptainer 1.1 or later);
    ``host``: the host's network."""
    containall: bool = True
    """``--containall``: private /tmp, $HOME, IPC and PID namespace, clean environment. The private $HOME stays
    writable (pip and git want one), so ``--no-home`` is off by default."""
    no_home: bool = False
    """``--no-home``: do not mount any home directory."""
    writable_tmpfs: bool = True
    """``--writable-tmpfs``: the image is writable, changes kept in memory (apptainer.conf caps the size)."""
    binds: list[str] = Field(default_factory=list)
    """Extra ``--bind`` specs, ``src[:dest[:ro]]``."""
    memory: str | None = None
    """``--memory`` limit (``2g``); needs cgroups v2 delegation for unprivileged users."""
    cpus: float | None = Field(None, gt=0)
    """``--cpus`` limit."""
    pids_limit: int | None = Field(None, gt=0)
    """``--pids-limit``."""
    start_args: list[str] = Field(default_factory=list)
    """More ``instance start`` flags, verbatim (``--fakeroot``, ``--nv``)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every command (the host's environment is never passed in)."""
    shell: list[str] = Field(default_factory=lambda: ["bash", "-lc"], min_length=1)
    """Argv, inside the container, the command string is appended to."""
    timeout: float = Field(30.0, gt=0)
    """Default per-command timeout in seconds; ``exec(timeout=...)`` overrides it."""
    kill_grace: float = Field(2.0, gt=0)
    """Seconds between ``timeout``'s SIGTERM and its SIGKILL, inside the container."""
    host_grace: float = Field(10.0, ge=0)
    """Seconds past timeout + kill_grace before this host kills the CLI process itself (a hung CLI)."""
    max_output_bytes: int = Field(1_000_000, ge=1)
    """Combined stdout+stderr kept per command; past it the command is stopped and ``truncated`` set."""
    start_timeout: float = Field(120.0, gt=0)
    """Seconds ``instance start`` may take."""
    build_timeout: float = Field(1800.0, gt=0)
    """Seconds converting a referenced image into a .sif may take."""

    @field_validator("workdir", "workspace_mount")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path in the container")
        return value if value is None else posixpath.normpath(value)

    @field_validator("workspace_root")
    @classmethod
    def _bindable(cls, value: str | None) -> str | None:
        if value is not None and (":" in value or "," in value):
            raise ValueError("cannot contain ':' or ',' (it goes into a --bind spec)")
        return value


class ApptainerRuntime:
    """One ``instance`` per rollout; each command an ``exec`` into it. The per-rollout host directory is
    bound in, so files under it are read and written on the host; other paths go through ``exec``."""

    def __init__(self, config: ApptainerRuntimeConfig | Mapping[str, Any] | None = None, *, run_id: str | None = None):
        if config is None:
            config = ApptainerRuntimeConfig()
        elif not isinstance(config, ApptainerRuntimeConfig):
            config = validate(ApptainerRuntimeConfig, config, prefix="runtime")
        self.config = config
        prefix = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id or "")[:32].strip("-.")
        self.name = f"rollout-{prefix + '-' if prefix else ''}{uuid.uuid4().hex[:12]}"
        """The instance name: predictable prefix (run id) so an operator can find and stop leftovers."""
        self.binary: str | None = None
        self.workspace: str | None = None
        self._started = False
        self._closed = False
        self._running: set[int] = set()  # process groups of CLI processes in flight, killed on close()

    @classmethod
    def from_config(cls, config: ApptainerRuntimeConfig | Mapping[str, Any], **deps: Any) -> ApptainerRuntime:
        return cls(config, run_id=deps.get("run_id"))

    @property
    def workdir(self) -> str:
        return self.config.workdir

    async def start(self) -> None:
        if self._closed:
            raise RuntimeFailure("ApptainerRuntime.start() after close()", retryable=False)
        if self._started:
            return
        binary = find_binary(self.config.binary)
        sif = await ensure_sif(binary, self.config.image, self.config.cache_dir, self.config.build_timeout)
        try:
            if self.config.workspace_root:
                os.makedirs(self.config.workspace_root, exist_ok=True)
            workspace = tempfile.mkdtemp(prefix="rollout-apptainer-", dir=self.config.workspace_root)
        except OSError as exc:
            raise ContainerStartError(f"cannot create a workspace: {exc}") from exc
        self.binary, self.workspace = binary, workspace
        _live[self.name] = (binary, workspace if not self.config.keep_workspace else None)
        _stop_leftovers_at_exit()
        ran = await run_capped(
            start_argv(self.config, sif, self.name, workspace, binary),
            timeout=self.config.start_timeout,
            max_output_bytes=_CONTROL_CAP,
        )
        if self._closed or ran.returncode != 0 or ran.timed_out:
            await self._teardown()
            if self._closed:
                raise RuntimeFailure("ApptainerRuntime was closed while starting")
            raise ContainerStartError(
                f"instance start of {self.config.image} failed ({failure_reason(ran)}): {ran.output[-_TAIL:]}"
            )
        self._started = True

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_open()
        limit = max(self.config.timeout if timeout is None else timeout, 0.001)  # `timeout 0` would mean no limit
        pwd = posixpath.normpath(posixpath.join(self.config.workdir, cwd)) if cwd else self.config.workdir
        argv = exec_argv(self.config, self.name, command, timeout=limit, pwd=pwd, env=env, binary=self.binary)
        # The host deadline only catches a hung CLI: the in-container `timeout` normally ends the command first.
        host_limit = limit + self.config.kill_grace + self.config.host_grace
        ran = await run_capped(
            argv, timeout=host_limit, max_output_bytes=self.config.max_output_bytes, running=self._running,
            stdin=stdin,
        )
        if self._closed:
            raise RuntimeFailure("ApptainerRuntime was closed while the command ran")
        if ran.returncode == 255 and "no instance found" in ran.output:
            raise RuntimeFailure(f"apptainer instance {self.name} is gone: {ran.output[-_TAIL:]}")
        fired = ran.returncode in (124, 128 + signal.SIGKILL) and ran.duration >= limit  # `timeout`'s exit codes
        return ran.model_copy(update={"timed_out": ran.timed_out or fired})

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to ``workdir``, or absolute in the container), creating parents."""
        inside, host = self._locate(path)
        if host is not None:
            return await asyncio.to_thread(write_host_file, host, bytes(data))
        staged, staged_inside = self._staging()
        await asyncio.to_thread(write_host_file, staged, bytes(data))
        try:
            q = shlex.quote
            result = await self.exec(f"mkdir -p {q(posixpath.dirname(inside))} && cat {q(staged_inside)} > {q(inside)}")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged)
        if result.returncode != 0:
            raise OSError(f"cannot write {inside} in the container: {result.output[-_TAIL:]}")

    async def read_file(self, path: str) -> bytes:
        """The bytes at ``path``; ``FileNotFoundError`` if there is none."""
        inside, host = self._locate(path)
        if host is not None:
            return await asyncio.to_thread(read_host_file, host)
        staged, staged_inside = self._staging()
        try:
            q = shlex.quote
            result = await self.exec(f"test -e {q(inside)} || exit 3; cat {q(inside)} > {q(staged_inside)}")
            if result.returncode == 3:
                raise FileNotFoundError(f"{inside}: no such file in the container")
            if result.returncode != 0:
                raise OSError(f"cannot read {inside} in the container: {result.output[-_TAIL:]}")
            return await asyncio.to_thread(read_host_file, staged)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in list(self._running):
            kill_group(pgid)
        if self.binary is not None:  # a start was attempted: the instance may exist even if start failed
            await self._teardown()

    async def _teardown(self) -> None:
        with contextlib.suppress(RuntimeFailure):
            await run_capped(stop_argv(self.binary, self.name), timeout=60.0, max_output_bytes=_CONTROL_CAP)
        _live.pop(self.name, None)
        if self.workspace is not None and not self.config.keep_workspace:
            await asyncio.to_thread(shutil.rmtree, self.workspace, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeFailure("ApptainerRuntime is closed")
        if not self._started:
            raise RuntimeFailure("ApptainerRuntime used before start()", retryable=False)

    def _locate(self, path: str) -> tuple[str, str | None]:
        """The container path, and its host path when it lies in the bound workspace."""
        self._check_open()
        inside = posixpath.normpath(posixpath.join(self.config.workdir, path))
        mount = self.config.workspace_mount or self.config.workdir
        if inside == mount or inside.startswith(mount.rstrip("/") + "/"):
            return inside, os.path.join(self.workspace, posixpath.relpath(inside, mount))
        return inside, None

    def _staging(self) -> tuple[str, str]:
        name = f".rollout-io-{uuid.uuid4().hex}"
        return os.path.join(self.workspace, name), posixpath.join(
            self.config.workspace_mount or self.config.workdir, name
        )


_live: dict[str, tuple[str, str | None]] = {}
"""Instances started and not yet stopped: name -> (binary, host directory to remove)."""
_atexit_installed = False


def _stop_leftovers_at_exit() -> None:
    """Installed on the first start, never at import: stops what a crash or a missed close() left running."""
    global _atexit_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(_stop_leftovers)


def _stop_leftovers() -> None:
    for name, (binary, workspace) in list(_live.items()):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(stop_argv(binary, name), check=False, capture_output=True, timeout=30)
        if workspace:
            shutil.rmtree(workspace, ignore_errors=True)
        _live.pop(name, None)
