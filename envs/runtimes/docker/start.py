"""Creating a container: the image it starts from (a harness layer on the configured one), its readable name, main
process and dead-man's switch, ulimits, disk limits, start errors that say what to do, quiet removal."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from envs.images.harness_images import ensure_harness_image
from envs.runtimes.docker import engines
from envs.runtimes.docker.config import PODMAN_ULIMITS
from envs.runtimes.docker.engines import explain, status
from rollout.errors import ContainerStartError

log = logging.getLogger(__name__)

SIZE_DRIVERS = ("devicemapper", "btrfs", "zfs", "windowsfilter")
"""Storage drivers that take ``--storage-opt size=`` on any backing filesystem."""
QUOTA_DRIVERS = ("overlay", "overlay2", "vfs")
"""Storage drivers that take it only over xfs mounted with ``pquota`` (not visible in the engine's info:
a refusal at create time is the final word)."""

NOTE_SCOPE_ENV = "ROLLOUT_FARM_NOTE_SCOPE"
"""Processes of one machine that share this variable's value (a run's workers on one node) say each engine note
(no disk limit) once between them; without it, each process says it once."""

_disk_support: dict[tuple[str, str | None], bool] = {}
_disk_lock = threading.RLock()
_pull_locks: dict[tuple[str, str | None, str], threading.Lock] = {}


def container_name(run_id: str, rollout_id: str) -> str:
    def clean(part: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_.-]+", "-", part).strip("-.")[:40] or "x"

    return f"rf-{clean(run_id)}-{clean(rollout_id)}-{secrets.token_hex(3)}"


def image_to_run(cfg: Any) -> str:
    """The image a container of ``cfg`` starts from: ``cfg.image``, or with a ``harness`` the layer holding it, built
    on ``cfg.image`` in the container's engine if missing (blocking: call it off the event loop)."""
    if not cfg.harness:
        return cfg.image
    return ensure_harness_image(cfg.image, cfg.harness, engines.client(cfg.container_engine, cfg.base_url))


def main_command(ttl: float, pid1_reaps: bool, die_with_owner: bool) -> list[str]:
    """The container's main process: the container lives while it does, and auto-remove deletes it after.

    It ends at the TTL and, with ``die_with_owner``, when its stdin (a stream held by the creating process,
    see ``attach_switch``) closes: ``cat`` sees end-of-file as soon as that process dies, however it dies.
    ``pid1_reaps``: no init from the engine, so a shell is PID 1 and waits (reaping orphans too); a background
    job's stdin would be /dev/null, hence the copy kept on fd 3.
    """
    seconds = str(max(1, round(ttl)))
    if not pid1_reaps:
        return ["timeout", seconds, "cat"] if die_with_owner else ["sleep", seconds]
    if die_with_owner:
        return ["sh", "-c", 'exec 3<&0; timeout "$0" cat <&3 3<&- & wait', seconds]
    return ["sh", "-c", 'sleep "$0" & wait', seconds]


def attach_switch(api: Any, container_id: str) -> Any:
    """The dead-man's switch: a stream attached to the container's stdin, to keep open for its whole life.

    The container is created with ``stdin_open`` and ``StdinOnce``, so when this stream closes (``release_switch``,
    or the kernel closing it because this process died, even of SIGKILL) the engine closes the main process's
    stdin and the container stops. Docker and podman both honour this through the same API."""
    return api.attach_socket(container_id, params={"stdin": 1, "stream": 1})


def release_switch(switch: Any) -> None:
    """Close the switch's stream (the SDK hands back a file-like wrapper over the connection's socket)."""
    raw = getattr(switch, "_sock", switch)
    for close in (lambda: raw.shutdown(socket.SHUT_RDWR), raw.close, switch.close):
        try:
            close()
        except Exception:  # noqa: BLE001 - already closed: the goal is reached
            pass


def ulimit(name: str, value: int | str) -> Any:
    import docker

    soft, _, hard = str(value).partition(":")
    return docker.types.Ulimit(name=name, soft=int(soft), hard=int(hard or soft))


def size_bytes(text: str) -> int:
    """Bytes in an engine size string: ``"64m"`` -> 67108864 (k, m, g are binary units, as for ``memory``)."""
    number, unit = re.fullmatch(r"([0-9]+)([bkmgBKMG]?)", text).groups()
    return int(number) << {"": 0, "b": 0, "k": 10, "m": 20, "g": 30}[unit.lower()]


def disk_limit_unsupported(info: dict[str, Any]) -> str | None:
    """Why the engine described by ``info`` (its ``/info`` reply) cannot limit a container's writable layer
    (``storage_opt={"size": ...}``), or none when it can."""
    driver = str(info.get("Driver") or "unknown")
    status = {str(k).lower(): str(v) for k, v in (info.get("DriverStatus") or []) if k}
    backing = status.get("backing filesystem", "")
    if driver in SIZE_DRIVERS or (driver in QUOTA_DRIVERS and backing == "xfs"):
        return None
    where = f"{driver} on {backing}" if backing else driver
    return f"storage driver {where} cannot limit a container's disk (needs overlay2 on xfs with pquota, " \
           f"devicemapper, btrfs or zfs)"


def disk_supported(api: Any, key: tuple[str, str | None]) -> bool:
    """Whether containers of engine ``key`` can get a disk limit; asked once per engine (the first containers of a
    run start side by side: one asks, the others wait for its answer), logged once if not."""
    with _disk_lock:
        if key not in _disk_support:
            try:
                why = disk_limit_unsupported(api.info())
            except Exception as exc:  # noqa: BLE001 - an engine that cannot say: no limit, and say so
                why = f"the engine's info failed ({explain(exc)})"
            if why:
                disk_refused(key, why)
            else:
                _disk_support[key] = True
        return _disk_support[key]


def disk_refused(key: tuple[str, str | None], why: str) -> None:
    """Record that engine ``key`` takes no disk limit, with one log line saying why: once per process, and once
    per machine among the processes of one ``NOTE_SCOPE_ENV`` scope."""
    with _disk_lock:
        said = _disk_support.get(key) is False
        _disk_support[key] = False
    if not said and first_on_machine(("disk", *key)):
        log.warning("%s: no per-container disk limit (runtime.disk): %s; the file size limit "
                    "(runtime.max_file_size) still bounds each file", key[0], why)


def first_on_machine(note: tuple[Any, ...]) -> bool:
    """True for the first process of this process's ``NOTE_SCOPE_ENV`` scope on this machine to ask about ``note``
    (an empty marker file in the temporary directory says who was first); always True without a scope, or when the
    marker cannot be written (saying a note twice beats never saying it)."""
    scope = os.environ.get(NOTE_SCOPE_ENV)
    if not scope:
        return True
    folder = Path(tempfile.gettempdir()) / "rollout-farm-notes"
    marker = folder / hashlib.sha256(repr((scope, note)).encode()).hexdigest()[:32]
    try:
        folder.mkdir(exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def is_disk_refusal(exc: BaseException) -> bool:
    """The engine refused ``--storage-opt size`` (e.g. overlay2 over xfs mounted without pquota)."""
    return "storage-opt" in str(exc).lower() or "storage opt" in str(exc).lower()


def start_error(exc: BaseException, image: str, engine: str) -> ContainerStartError:
    if isinstance(exc, ContainerStartError):
        return exc
    if status(exc) == 404 and "image" in str(exc).lower():
        return ContainerStartError(
            f"image {image!r} not found in {engine}: build it with `rollout images base` (the base image) or "
            f"`rollout images build` (task images), or set runtime.pull=missing to pull it from a registry",
            False,
        )
    return ContainerStartError(f"cannot start a {engine} container from {image!r}: {explain(exc)}")


def pull_lock(engine: str, base_url: str | None, image: str) -> threading.Lock:
    """The lock one image's pull holds on one engine in this process: two rollouts never pull it at once."""
    with _disk_lock:
        return _pull_locks.setdefault((engine, base_url, image), threading.Lock())


def quiet_remove(api: Any, container_id: str) -> None:
    try:
        api.remove_container(container_id, force=True)
    except Exception:  # noqa: BLE001 - already gone (auto-remove) or being removed: the goal is reached
        pass


def host_config(api: Any, cfg: Any, engine: str, *, engine_init: bool, disk: bool) -> Any:
    """The container's limits as the engine takes them: memory (no swap beyond it), CPUs, pids, every
    capability dropped but ``cap_add``, ulimits (podman's defaults unless given; ``max_file_size`` as ``fsize``),
    the disk quota where the storage driver has one, the ``binds``, removed when it stops."""
    ulimits = dict(cfg.ulimits if cfg.ulimits is not None else (PODMAN_ULIMITS if engine == "podman" else {}))
    if cfg.max_file_size is not None:
        ulimits.setdefault("fsize", size_bytes(cfg.max_file_size))
    return api.create_host_config(
        network_mode=cfg.network, mem_limit=cfg.memory, memswap_limit=cfg.memory, nano_cpus=int(cfg.cpus * 1e9),
        pids_limit=cfg.pids_limit, cap_drop=["ALL"], cap_add=cfg.cap_add or None, security_opt=cfg.security_opt,
        init=engine_init, auto_remove=True, ulimits=[ulimit(k, v) for k, v in ulimits.items()] or None,
        storage_opt={"size": cfg.disk} if disk else None, binds=list(cfg.binds) or None,
    )
