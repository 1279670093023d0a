"""File copy in and out of a running container through the engine API (a tar archive built in memory), and
``EngineContainer``: what a runtime offers those who copy trees through it (Harbor's tasks)."""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from typing import Any, Callable, Protocol, runtime_checkable

from envs.runtimes.docker.config import DockerRuntimeConfig
from envs.runtimes.docker.engines import status
from rollout.protocols import ExecResult, Runtime


@runtime_checkable
class EngineContainer(Runtime, Protocol):
    """A runtime whose commands run in a container of an engine's API (``DockerRuntime``, docker or podman): calls
    on its container through the engine (``get_tree``, ``put_tree``), commands as a given user through a given
    shell, and its section, which a task may change between its steps (``user``)."""

    config: DockerRuntimeConfig

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None, user: str | None = None, shell: list[str] | None = None,
    ) -> ExecResult:
        """As ``Runtime.exec``; ``user``: who runs it (none: the section's); ``shell``: the argv it is appended to
        (none: the section's)."""
        ...

    async def engine_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(api, container_id, *args)`` off the event loop, engine errors as ``RuntimeFailure``."""
        ...


def put_file(api: Any, container: str, target: str, data: bytes) -> None:
    """Write ``data`` to the absolute path ``target``, creating missing parent directories."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(posixpath.basename(target))
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    parent = posixpath.dirname(target) or "/"
    try:
        api.put_archive(container, parent, buffer.getvalue())
    except Exception as exc:
        if status(exc) != 404 or not running(api, container):
            raise
        # The parent directory is missing: create it, then try again (rare; costs one exec). Creating only
        # what is missing keeps the mode and owner of existing directories, which an archive entry would reset.
        made = api.exec_create(container, ["mkdir", "-p", "--", parent])["Id"]
        api.exec_start(made)
        api.put_archive(container, parent, buffer.getvalue())


def get_file(api: Any, container: str, target: str) -> bytes:
    """The bytes of the regular file at ``target``; ``FileNotFoundError`` / ``IsADirectoryError`` otherwise."""
    try:
        stream, _ = api.get_archive(container, target)
    except Exception as exc:
        if status(exc) == 404 and running(api, container):
            raise FileNotFoundError(target) from None
        raise
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as tar:
        member = tar.next()
        if member is not None and member.isdir():
            raise IsADirectoryError(target)
        if member is None or not member.isfile():
            raise FileNotFoundError(target)
        return tar.extractfile(member).read()


def running(api: Any, container: str) -> bool:
    """Whether the container is still there and running (a 404 then means the file, not the container)."""
    try:
        return bool(api.inspect_container(container)["State"].get("Running"))
    except Exception:  # noqa: BLE001 - gone, or the engine is down: either way, not running
        return False


def get_tree(api: Any, container: str, path: str) -> bytes:
    """The engine's tar of the directory ``path`` (its entries named ``<basename>/...``), read by the engine, not
    by any program in the container."""
    stream, _ = api.get_archive(container, path)
    return b"".join(stream)


def put_tree(api: Any, container: str, parent: str, archive: bytes) -> None:
    """Unpack ``archive`` (a tar) into the existing directory ``parent``, by the engine."""
    api.put_archive(container, parent, archive)
