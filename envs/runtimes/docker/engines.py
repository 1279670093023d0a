"""Connections to container engines (docker, podman's docker API) and the thread pool their blocking SDK runs in."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rollout.errors import ContainerStartError

T = TypeVar("T")

IO_THREADS_ENV = "ROLLOUT_DOCKER_THREADS"
"""Environment variable overriding the size of the engine I/O thread pool."""
DEFAULT_IO_THREADS = 256
"""One thread per engine call in flight. An exec holds its thread while its output streams in, so this
bounds the commands one process runs at once (more wait their turn). Threads start on demand and are
cheap while blocked on a socket; the default event-loop executor (min(32, cpus+4)) would be far too small."""
PODMAN_START_WAIT = 20.0
"""Seconds to wait for a podman API service we started to answer."""

_pool: ThreadPoolExecutor | None = None
_clients: dict[tuple[str, str | None], Any] = {}
_lock = threading.Lock()
_services: list[subprocess.Popen] = []  # kept so the Popen objects are not collected while running


def io_pool() -> ThreadPoolExecutor:
    """The process-wide pool every blocking engine call runs in (created on first use)."""
    global _pool
    if _pool is None:
        with _lock:
            if _pool is None:
                size = int(os.environ.get(IO_THREADS_ENV) or DEFAULT_IO_THREADS)
                _pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="rollout-engine-io")
    return _pool


async def in_pool(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking engine call in the I/O pool without blocking the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(io_pool(), functools.partial(fn, *args, **kwargs))


def client(engine: str = "docker", base_url: str | None = None) -> Any:
    """A ``docker.DockerClient`` for ``engine``, shared process-wide (its connection pool is thread-safe).

    ``base_url`` none: docker from the environment (``DOCKER_HOST``...); podman through its API socket,
    started here if nothing answers (see ``podman_url``). Raises ``ContainerStartError`` if unreachable.
    """
    key = (engine, base_url)
    found = _clients.get(key)
    if found is not None:
        return found
    with _lock:
        if key not in _clients:
            _clients[key] = _connect(engine, base_url)
        return _clients[key]


def cached_clients() -> list[tuple[str, str | None, Any]]:
    return [(engine, url, c) for (engine, url), c in list(_clients.items())]


def status(exc: BaseException) -> int | None:
    """The HTTP status of an engine API error (404: no such container/image/file; 409: not running)."""
    return getattr(getattr(exc, "response", None), "status_code", None)


def explain(exc: BaseException) -> str:
    """The engine's own words for an API error, without the SDK's URL noise."""
    return str(getattr(exc, "explanation", None) or exc)


def _connect(engine: str, base_url: str | None) -> Any:
    try:
        import docker
    except ImportError as exc:
        raise ContainerStartError("the docker SDK is not installed: pip install 'rollout-farm[docker]'", False) from exc
    url = base_url
    if url is None and engine == "podman":
        url = podman_url()
    where = url or "the environment's DOCKER_HOST (default unix:///var/run/docker.sock)"
    pool = int(os.environ.get(IO_THREADS_ENV) or DEFAULT_IO_THREADS)
    try:
        if url is None:
            return docker.from_env(max_pool_size=pool)
        return docker.DockerClient(base_url=url, max_pool_size=pool)
    except docker.errors.DockerException as exc:
        raise ContainerStartError(f"cannot reach the {engine} engine at {where}: {exc}") from exc


def podman_url() -> str:
    """podman's docker-compatible API: ``CONTAINER_HOST`` if set, else its default socket
    (/run/podman/podman.sock for root, $XDG_RUNTIME_DIR/podman/podman.sock otherwise).

    If nothing answers there, start ``podman system service --time=0`` on that socket, detached, once
    (a lock file keeps parallel processes from racing). It keeps serving later processes, as the
    ``podman.socket`` systemd unit would; stop it by its pid when no longer wanted.
    """
    url = os.environ.get("CONTAINER_HOST")
    if url:
        return url
    if os.geteuid() == 0:
        path = "/run/podman/podman.sock"
    else:
        runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/podman-run-{os.getuid()}"
        path = os.path.join(runtime_dir, "podman", "podman.sock")
    if not _answers(path):
        _start_podman_service(path)
    return f"unix://{path}"


def _answers(path: str, timeout: float = 2.0) -> bool:
    """True when an API server replies to ``GET /_ping`` on the unix socket ``path``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
            return s.recv(64).split(b" ", 2)[1:2] == [b"200"]
    except OSError:
        return False


def _start_podman_service(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be starting it right now
        if _answers(path):
            return
        log_path = path + ".log"
        try:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    ["podman", "system", "service", "--time=0", f"unix://{path}"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # outlives us, like a socket-activated service; not hit by our ^C
                    cwd=os.path.dirname(path),  # conmon drops files (an "oom" marker) into its cwd
                )
        except OSError as exc:
            raise ContainerStartError(f"cannot start the podman API service: {exc}", False) from exc
        deadline = time.monotonic() + PODMAN_START_WAIT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ContainerStartError(
                    f"`podman system service` exited with {proc.returncode}: {_tail(log_path)} (log: {log_path})"
                )
            if _answers(path):
                _services.append(proc)
                return
            time.sleep(0.05)
        proc.kill()
        raise ContainerStartError(f"the podman API service did not answer on {path} within {PODMAN_START_WAIT:.0f}s")


def _tail(path: str, size: int = 500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""
