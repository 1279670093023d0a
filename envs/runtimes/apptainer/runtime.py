"""ApptainerRuntime: one apptainer/singularity instance per rollout, driven through its CLI, a host directory
bound in."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
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
from typing import Any

from envs.images.apptainer_images import ensure_sif, find_binary
from envs.runtimes import exit_stops
from envs.runtimes.apptainer import owner_watch
from envs.runtimes.apptainer.argv import (  # noqa: F401 - re-exported
    LIMITS_SAFE_OUTSIDE,
    exec_argv,
    limits_argv,
    list_argv,
    resource_limits,
    start_argv,
    stop_argv,
    workspace_mount,
)
from envs.runtimes.apptainer.config import ApptainerRuntimeConfig
from envs.runtimes.host_files import read_host_file, write_host_file
from envs.runtimes.process import failure_reason, kill_group, kill_pid_namespace, run_capped
from rollout.config.load import coerce
from rollout.errors import ContainerStartError, RuntimeFailure
from rollout.protocols import ExecResult

_CONTROL_CAP = 1 << 20
"""Output kept from instance start/stop commands (only their tail is ever shown)."""
_TAIL = 2000


class ApptainerRuntime:
    """One ``instance`` per rollout; each command an ``exec`` into it. The per-rollout host directory is
    bound in, so files under it are read and written on the host; other paths go through ``exec``."""

    def __init__(self, config: ApptainerRuntimeConfig | Mapping[str, Any] | None = None, *, run_id: str | None = None):
        self.config = coerce(ApptainerRuntimeConfig, config, prefix="runtime")
        prefix = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id or "")[:32].strip("-.")
        self.name = f"rollout-{prefix + '-' if prefix else ''}{uuid.uuid4().hex[:12]}"
        """The instance name: predictable prefix (run id) so an operator can find and stop leftovers."""
        self.binary: str | None = None
        self.workspace: str | None = None
        self.mount = self.config.workspace_mount or self.config.workdir
        """Where ``workspace`` is bound in the container (decided at start, from the image)."""
        self._started = False
        self._closed = False
        self._running: set[int] = set()  # process groups of CLI processes in flight, killed on close()
        self._limits_inside = True
        """The resource limits are set inside the container, on each command alone (``_place_limits``)."""

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
        sif = await ensure_sif(binary, self.config.image, self.config.cache_dir, self.config.build_timeout,
                               convert_to=self.config.convert_to, transport=self.config.transport)
        try:
            if self.config.workspace_root:
                os.makedirs(self.config.workspace_root, exist_ok=True)
            workspace = tempfile.mkdtemp(prefix="rollout-apptainer-", dir=self.config.workspace_root)
        except OSError as exc:
            raise ContainerStartError(f"cannot create a workspace: {exc}") from exc
        self.binary, self.workspace, self.mount = binary, workspace, workspace_mount(self.config, sif)
        exit_stops.stop_at_exit(self.name, owner_watch.unregistering(binary, self.name, functools.partial(
            _stop_instance, binary, self.name, workspace if not self.config.keep_workspace else None)))
        owner_watch.register(binary, self.name, workspace if not self.config.keep_workspace else None)
        ran = await run_capped(
            start_argv(self.config, sif, self.name, workspace, binary, self.mount),
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
        if limits_argv(self.config):
            await self._place_limits()
        if self.mount != self.config.workdir:  # the workdir is the image's, or made in its writable layer
            made = await self.exec(f"mkdir -p {shlex.quote(self.config.workdir)}", cwd="/")
            if made.returncode != 0:
                await self.close()
                raise ContainerStartError(f"cannot make workdir {self.config.workdir} in {self.config.image}: "
                                          f"{made.output[-_TAIL:]}", retryable=False)

    async def _place_limits(self) -> None:
        """Where the farm's resource limits are set: inside the container, on each command alone, when the image has
        ``prlimit``; on the CLI that execs it when it has none and each limit is safe there (``LIMITS_SAFE_OUTSIDE``);
        else the start fails naming the field (the instance stopped). Tried once here, so a limit that cannot be set
        names its field."""
        refused = await self._limits_refused()
        if refused is not None:
            await self.close()
            raise refused

    async def _limits_refused(self) -> ContainerStartError | None:
        limits, image = limits_argv(self.config), self.config.image
        probe = [self.binary, "exec", "--cleanenv", f"instance://{self.name}", *limits, "true"]
        tried = await run_capped(probe, timeout=self.config.start_timeout, max_output_bytes=_CONTROL_CAP)
        if tried.returncode == 0:
            return None
        if tried.timed_out or "no instance found" in tried.output:
            return ContainerStartError(f"instance {self.name} did not answer ({failure_reason(tried)}): "
                                       f"{tried.output[-_TAIL:]}")
        if not _not_found("prlimit", tried.output):
            return ContainerStartError(f"runtime.ulimits / max_file_size cannot be set in {image}: "
                                       f"{tried.output.strip()[-_TAIL:]} (a limit above the hard limit it has)",
                                       retryable=False)
        unsafe = sorted(set(resource_limits(self.config)) - LIMITS_SAFE_OUTSIDE)
        if unsafe:
            return ContainerStartError(
                f"runtime.ulimits {', '.join(unsafe)}: {image} has no prlimit (util-linux) to set them on the command "
                "alone, and set on apptainer's CLI they would bound its own runtime too; add util-linux to the image, "
                "or keep to " + ", ".join(sorted(LIMITS_SAFE_OUTSIDE)), retryable=False)
        try:
            on_host = await run_capped([*limits, "true"], timeout=30.0, max_output_bytes=_CONTROL_CAP)
        except RuntimeFailure as exc:  # no prlimit (util-linux) on this host's PATH either
            return ContainerStartError(f"runtime.ulimits / max_file_size are set with prlimit, which neither {image} "
                                       f"nor this node has: {exc}", retryable=False)
        if on_host.returncode != 0:
            return ContainerStartError(f"runtime.ulimits / max_file_size cannot be set here: {on_host.output.strip()}"
                                       " (a limit above the hard limit this process has)", retryable=False)
        self._limits_inside = False
        return None

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_open()
        limit = max(self.config.timeout if timeout is None else timeout, 0.001)  # `timeout 0` would mean no limit
        pwd = posixpath.normpath(posixpath.join(self.config.workdir, cwd)) if cwd else self.config.workdir
        argv = exec_argv(self.config, self.name, command, timeout=limit, pwd=pwd, env=env, binary=self.binary,
                         limits_inside=self._limits_inside)
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
        if ran.returncode < 0 and not (ran.timed_out or ran.truncated):
            # apptainer (and `timeout`) die of the signal that killed the command: say it as a shell does, 128 + N
            ran = ran.model_copy(update={"returncode": 128 - ran.returncode})
        fired = ran.returncode in (124, 128 + signal.SIGKILL) and ran.duration >= limit  # `timeout`'s exit codes
        update: dict[str, Any] = {"timed_out": ran.timed_out or fired}
        if update["timed_out"]:  # what the command left, `setsid` included, goes with it: one command at a time
            await self._stop_leftovers()
        if ran.returncode == 128 + signal.SIGXFSZ and self.config.max_file_size is not None:
            update["output"] = (f"{ran.output}\n[File size limit exceeded: a file reached max_file_size "
                                f"({self.config.max_file_size})]\n")
        return ran.model_copy(update=update)

    async def _stop_leftovers(self) -> None:
        """Kill every process in the instance but its init, from the host (a fork bomb leaves no room for a
        command inside): only where the instance has a PID namespace of its own (``containall``)."""
        if not self.config.containall:
            return
        with contextlib.suppress(RuntimeFailure):
            listed = await run_capped(list_argv(self.binary, self.name), timeout=30.0, max_output_bytes=_CONTROL_CAP)
            with contextlib.suppress(ValueError, LookupError, TypeError):
                text = listed.output[listed.output.find("{"):listed.output.rfind("}") + 1]  # past any INFO line
                init = int(json.loads(text)["instances"][0]["pid"])
                await asyncio.to_thread(kill_pid_namespace, init)

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
        exit_stops.forget(self.name)
        if self.workspace is not None and not self.config.keep_workspace:
            await asyncio.to_thread(shutil.rmtree, self.workspace, ignore_errors=True)
        owner_watch.unregister(self.binary, self.name)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeFailure("ApptainerRuntime is closed")
        if not self._started:
            raise RuntimeFailure("ApptainerRuntime used before start()", retryable=False)

    def _locate(self, path: str) -> tuple[str, str | None]:
        """The container path, and its host path when it lies in the bound workspace."""
        self._check_open()
        inside = posixpath.normpath(posixpath.join(self.config.workdir, path))
        mount = self.mount
        if inside == mount or inside.startswith(mount.rstrip("/") + "/"):
            return inside, os.path.join(self.workspace, posixpath.relpath(inside, mount))
        return inside, None

    def _staging(self) -> tuple[str, str]:
        name = f".rollout-io-{uuid.uuid4().hex}"
        return os.path.join(self.workspace, name), posixpath.join(self.mount, name)


def _not_found(program: str, output: str) -> bool:
    """The CLI's answer to an ``exec`` of ``program`` the image does not have (``"prlimit": executable file not
    found in $PATH``)."""
    return f'"{program}": executable file not found' in output


def _stop_instance(binary: str, name: str, workspace: str | None) -> None:
    """Stop an instance a crash or a missed close() left running, and remove its host directory (at exit)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(stop_argv(binary, name), check=False, capture_output=True, timeout=30)
    if workspace:
        shutil.rmtree(workspace, ignore_errors=True)
