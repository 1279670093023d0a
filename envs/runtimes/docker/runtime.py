"""DockerRuntime: one locked-down container per rollout (docker, or podman through its docker-compatible API)."""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Mapping
from typing import Any

from envs.runtimes import warm_pool
from envs.runtimes.docker import containers, engines, start as docker_start, start_gate
from envs.runtimes.docker.commands import WRAPPER, ExecJob
from envs.runtimes.docker.config import DockerRuntimeConfig
from envs.runtimes.docker.engines import explain, status
from envs.runtimes.docker.files import get_file, put_file
from envs.runtimes.docker.owner_watch import WITH_OWNER_LABEL, ensure_watchdog
from rollout.config.load import coerce
from rollout.errors import RuntimeFailure
from rollout.protocols import ExecResult

_BACKSTOP = 5.0
"""Seconds past timeout + kill_grace after which the host stops waiting and kills the command itself
(only if the in-container ``timeout`` could not, e.g. a process that left its group and kept the output open)."""
_NO_INIT = "container-init binary not found"
"""podman's error when its init (catatonit) is not installed."""
_SIGXFSZ_EXIT = 128 + 25
"""Exit status of a command killed by SIGXFSZ, the signal for writing past the file size limit."""
_engines_without_init: set[tuple[str, str | None]] = set()


class DockerRuntime:
    """A container started per rollout, commands run in it through the engine's exec API.

    Each command runs as ``timeout -k <grace> <timeout> <shell> <command>`` inside the container (the API
    has no exec timeout, and killing the client side would leave the process running), with a host-side
    deadline as a backstop. A failing, timed-out or OOM-killed command is an ``ExecResult``; a container that
    is gone (TTL, removed, engine down) is a ``RuntimeFailure``. Blocking SDK calls run in the shared I/O
    pool of ``envs.runtimes.docker.engines``, never on the event loop.
    """

    def __init__(self, config: DockerRuntimeConfig | Mapping[str, Any] | None = None, *,
                 run_id: str | None = None, rollout_id: str | None = None, **_: Any):
        self.config = config = coerce(DockerRuntimeConfig, config, prefix="runtime")
        self.engine = config.container_engine
        self.run_id = run_id or config.run_id or "adhoc"
        self.rollout_id = rollout_id or config.rollout_id or "rollout"
        self.name = docker_start.container_name(self.run_id, self.rollout_id)
        """Predictable and readable: rf-<run>-<rollout>-<random>."""
        self.container_id: str | None = None
        self._image = config.image
        """What the container starts from: the configured image, or its harness layer (``start`` resolves it)."""
        self._api: Any = None
        self._switch: Any = None
        self._started_at = 0.0
        self._closed = False
        self._running: set[ExecJob] = set()

    @classmethod
    def from_config(cls, config: DockerRuntimeConfig | Mapping[str, Any], **deps: Any) -> DockerRuntime:
        """Accepts ``run_id`` / ``rollout_id``; other deps (``trusted_model``...) do not matter here."""
        return cls(config, run_id=deps.get("run_id"), rollout_id=deps.get("rollout_id"))

    @property
    def workdir(self) -> str:
        return self.config.workdir

    async def start(self) -> None:
        if self._closed:
            raise RuntimeFailure("DockerRuntime.start() after close()", retryable=False)
        if self.container_id is None and self.config.warm_pool:
            self._adopt(await self._pool().acquire())
        elif self.container_id is None:
            containers.install_hooks()  # here, on the loop's thread: a signal handler needs the main thread
            cfg = self.config
            # A harness layer may build now: in the I/O pool, whose threads are many, so rollouts waiting for the
            # build never hold up the loop's small default executor.
            self._image = await engines.in_pool(docker_start.image_to_run, cfg)
            gate = start_gate.gate_for(self.engine, cfg.base_url, cfg.start_limit, cfg.start_rate)
            await gate.run(lambda: engines.in_pool(self._start_blocking), retries=cfg.start_retries,
                           engine=self.engine, before_retry=lambda: engines.in_pool(self._remove_half_started))

    def _pool(self) -> warm_pool.WarmPool:
        cfg = self.config.model_copy(update={"warm_pool": 0, "rollout_id": None})
        key = ("docker-runtime", self.engine, self.run_id, cfg.model_dump_json())
        return warm_pool.pool_for(
            key, lambda: DockerRuntime(cfg, run_id=self.run_id, rollout_id="pool"), self.config.warm_pool
        )

    def _adopt(self, donor: DockerRuntime) -> None:
        """Take over a started container from the pool (its labels say rollout "pool")."""
        self._api, self.container_id, self._started_at, self.name, self._switch = (
            donor._api, donor.container_id, donor._started_at, donor.name, donor._switch)
        donor.container_id, donor._switch, donor._closed = None, None, True

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None, user: str | None = None, shell: list[str] | None = None,
    ) -> ExecResult:
        """``user``: who runs it (a name or uid; default the config's ``user``, else the image's USER); ``shell``:
        the argv it is appended to (default the config's ``shell``)."""
        container = self._check_open()
        cfg = self.config
        limit = cfg.timeout if timeout is None else timeout
        directory = posixpath.join(cfg.workdir, cwd) if cwd else cfg.workdir  # an absolute cwd replaces workdir
        argv = ["sh", "-c", WRAPPER, "rollout-exec", directory, f"{limit:g}", f"{cfg.kill_grace:g}",
                *(shell or cfg.shell), command]
        job = ExecJob(self._api, container, argv, env or {}, limit, cfg.kill_grace, _BACKSTOP, cfg.max_output_bytes,
                      stdin=stdin, user=user or cfg.user)
        self._running.add(job)
        began = time.monotonic()
        try:
            returncode, ended = await engines.in_pool(self._guarded, job.run)
        except asyncio.CancelledError:
            job.abort()  # the pool thread stops reading and kills the command
            raise
        finally:
            self._running.discard(job)
        duration = time.monotonic() - began
        if self._closed:
            raise RuntimeFailure("DockerRuntime was closed while the command ran")
        timed_out = ended == "deadline" or returncode == 124 or (returncode == 137 and duration >= limit)
        output = job.output.text()
        if returncode == 137 and not timed_out and ended == "eof":
            await engines.in_pool(self._check_alive)  # SIGKILL from outside: the container itself may be gone
            output += f"\n[killed (out of memory?): the command got SIGKILL; the memory limit is {cfg.memory}]\n"
        if returncode == _SIGXFSZ_EXIT and cfg.max_file_size is not None:
            output += (f"\n[File size limit exceeded: a file reached max_file_size ({cfg.max_file_size}); "
                       f"the writer was stopped]\n")
        return ExecResult(output=output, returncode=returncode, timed_out=timed_out,
                          truncated=job.output.truncated, duration=duration)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to the workdir), creating parent directories."""
        container = self._check_open()
        target = posixpath.join(self.config.workdir, path)
        await engines.in_pool(self._guarded, put_file, self._api, container, target, bytes(data))

    async def read_file(self, path: str) -> bytes:
        """The bytes at ``path`` (relative to the workdir); ``FileNotFoundError`` if there is none."""
        container = self._check_open()
        target = posixpath.join(self.config.workdir, path)
        return await engines.in_pool(self._guarded, get_file, self._api, container, target)

    async def engine_call(self, fn: Any, *args: Any) -> Any:
        """``fn(api, container_id, *args)`` on the I/O pool, engine errors as ``RuntimeFailure`` (e.g. the
        tree copies of ``envs.runtimes.docker.files``)."""
        return await engines.in_pool(self._guarded, fn, self._api, self._check_open(), *args)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for job in list(self._running):
            job.abort()
        if self.container_id is not None:
            await engines.in_pool(self._remove)

    # ---- blocking parts, run in the I/O pool -------------------------------------------------------

    def _start_blocking(self, pulled: bool = False, reclaimed: bool = False) -> None:
        """Create and start the container. Its name is this runtime's alone (a random suffix): a container the
        engine says holds it is this runtime's own earlier create, whose answer was lost (a daemon that went down
        under it, and the removal before the retry could not reach it either); it is removed and the name taken."""
        cfg = self.config
        api = engines.client(self.engine, cfg.base_url).api
        key = (self.engine, cfg.base_url)
        labels = {**cfg.labels, containers.RUN_LABEL: self.run_id, containers.ROLLOUT_LABEL: self.rollout_id,
                  **containers.owner_labels()}
        if cfg.die_with_owner:  # the watchdog removes it even if the owner dies before it starts
            labels[WITH_OWNER_LABEL] = "1"
            ensure_watchdog(self.engine, cfg.base_url)
        disk = cfg.disk is not None and docker_start.disk_supported(api, key)
        engine_init = cfg.init and key not in _engines_without_init
        command = docker_start.main_command(cfg.ttl, cfg.init and not engine_init, cfg.die_with_owner)
        host_config = docker_start.host_config(api, cfg, self.engine, engine_init=engine_init, disk=disk)
        try:
            # stdin_open without detach: the SDK then sets StdinOnce, so the engine closes the main process's
            # stdin when the switch's stream closes.
            created = api.create_container(self._image, command, name=self.name, labels=labels, environment=cfg.env,
                                           working_dir=cfg.workdir, host_config=host_config,
                                           stdin_open=cfg.die_with_owner, detach=not cfg.die_with_owner)
        except Exception as exc:
            if engine_init and _NO_INIT in str(exc):
                _engines_without_init.add(key)
                return self._start_blocking(pulled, reclaimed)
            if disk and docker_start.is_disk_refusal(exc):
                docker_start.disk_refused(key, explain(exc))
                return self._start_blocking(pulled, reclaimed)
            if status(exc) == 404 and "image" in str(exc).lower() and cfg.pull == "missing" and not pulled:
                self._pull(api)
                return self._start_blocking(pulled=True, reclaimed=reclaimed)
            if status(exc) == 409 and self.name in str(exc) and not reclaimed:
                docker_start.quiet_remove(api, self.name)
                return self._start_blocking(pulled, reclaimed=True)
            raise docker_start.start_error(exc, self._image, self.engine) from exc
        cid = created["Id"]
        containers.track(cid, self.engine, cfg.base_url, self.name)
        switch = None
        try:
            if cfg.die_with_owner:  # attached before the start: the container never runs without its switch
                switch = docker_start.attach_switch(api, cid)
            api.start(cid)
        except Exception as exc:
            docker_start.quiet_remove(api, cid)
            containers.untrack(cid)
            if switch is not None:
                docker_start.release_switch(switch)
            raise docker_start.start_error(exc, self._image, self.engine) from exc
        self._api, self.container_id, self._switch, self._started_at = api, cid, switch, time.monotonic()
        if self._closed:  # close() ran while we were starting
            self._remove()

    def _pull(self, api: Any) -> None:
        """Pull the image, once: rollouts that miss it at the same moment wait for the first one's pull."""
        image = self.config.image
        with docker_start.pull_lock(self.engine, self.config.base_url, image):
            try:
                api.inspect_image(image)
                return  # another rollout's pull brought it while this one waited
            except Exception:  # noqa: BLE001 - not there yet: pull it
                pass
            try:
                api.pull(image)
            except Exception as exc:
                raise docker_start.start_error(exc, image, self.engine) from exc

    def _remove_half_started(self) -> None:
        """Before a start is tried again: the engine may have created the container although its answer was lost
        (a timeout), and the retry takes the same name."""
        api = engines.client(self.engine, self.config.base_url).api
        docker_start.quiet_remove(api, self.name)

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` with engine errors turned into ``RuntimeFailure`` (the container is gone, or the engine)."""
        try:
            return fn(*args)
        except (FileNotFoundError, IsADirectoryError):
            raise
        except Exception as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: BaseException) -> RuntimeFailure:
        if self._closed:
            return RuntimeFailure("DockerRuntime was closed while the command ran")
        if status(exc) in (404, 409):
            age = time.monotonic() - self._started_at
            why = f"its ttl of {self.config.ttl:g}s passed" if age >= self.config.ttl else "it died or was removed"
            return RuntimeFailure(f"container {self.name} is gone ({why}): {explain(exc)}")
        return RuntimeFailure(f"{self.engine} engine error for container {self.name}: {explain(exc)}")

    def _check_alive(self) -> None:
        try:
            state = self._api.inspect_container(self.container_id)["State"]
        except Exception as exc:
            raise self._failure(exc) from exc
        if not state.get("Running"):
            oom = " (out of memory)" if state.get("OOMKilled") else ""
            raise RuntimeFailure(f"container {self.name} died{oom}: exit code {state.get('ExitCode')}")

    def _remove(self) -> None:
        docker_start.quiet_remove(self._api, self.container_id)
        containers.untrack(self.container_id)
        if self._switch is not None:  # after the removal, which is then prompt and certain; this frees the socket
            docker_start.release_switch(self._switch)
            self._switch = None

    def _check_open(self) -> str:
        if self._closed:
            raise RuntimeFailure("DockerRuntime is closed")
        if self.container_id is None:
            raise RuntimeFailure("DockerRuntime used before start()", retryable=False)
        return self.container_id

