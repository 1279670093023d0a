"""Container bookkeeping: labels, the live-container tracker (freed at exit, on SIGTERM), garbage collection."""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from typing import Any

from envs.runtimes import exit_stops
from envs.runtimes.docker import engines
from envs.runtimes.docker.owners import OWNER_LABEL, OWNER_START_LABEL, _start_ticks, owner_alive
from rollout.errors import ConfigError

RUN_LABEL = "rollout-farm.run"
"""The run id; every container we create carries it (the reaper's filter)."""
ROLLOUT_LABEL = "rollout-farm.rollout"
"""The rollout id within the run."""
NODE_LABEL = "rollout-farm.node"
"""The farm node (Ray node id) whose worker created the container, when it runs on a farm."""
NODE_ENV = "ROLLOUT_FARM_NODE"
"""Set by a farm worker process to its node id; becomes the container's ``NODE_LABEL``."""

# container id -> (engine, base_url, name), for ``tracked``; the removal itself is an exit stop of
# ``envs.runtimes.exit_stops`` (plain dict operations: no lock a SIGTERM handler could deadlock on).
_live: dict[str, tuple[str, str | None, str]] = {}


def owner_labels() -> dict[str, str]:
    """Labels naming this process as the owner of the containers it creates."""
    labels = {OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}", OWNER_START_LABEL: str(_start_ticks(os.getpid()))}
    node = os.environ.get(NODE_ENV)
    if node:
        labels[NODE_LABEL] = node
    return labels


def track(container_id: str, engine: str, base_url: str | None, name: str) -> None:
    """Remember a live container; it is removed at interpreter exit or on SIGTERM unless ``untrack``ed first."""
    _live[container_id] = (engine, base_url, name)
    exit_stops.stop_at_exit(_key(container_id), lambda: _remove(container_id, engine, base_url))


def untrack(container_id: str) -> None:
    _live.pop(container_id, None)
    exit_stops.forget(_key(container_id))


def tracked() -> list[str]:
    """Names of the containers this process has started and not closed."""
    return [name for _, _, name in list(_live.values())]


def remove_tracked() -> list[str]:
    """Force-remove every tracked container (and stop whatever else this process registered to stop at exit),
    in parallel; returns the containers' names."""
    names = tracked()
    _live.clear()
    exit_stops.stop_all()
    return names


def install_hooks() -> None:
    """The exit and SIGTERM stops installed now (a SIGTERM handler needs the main thread)."""
    exit_stops.install_hooks()


def _key(container_id: str) -> str:
    return f"container:{container_id}"


def _remove(container_id: str, engine: str, base_url: str | None) -> None:
    """Force-remove one container with a fresh client (the cached one's locks may be held by the code a signal
    interrupted)."""
    versions = {(e, u): c.api.api_version for e, u, c in engines.cached_clients()}
    _fresh_api(engine, base_url, versions.get((engine, base_url))).remove_container(container_id, force=True)


def _fresh_api(engine: str, base_url: str | None, version: str | None) -> Any:
    import docker

    url = base_url or (engines.podman_url() if engine == "podman" else None)
    if url is None:
        return docker.from_env(version=version or "auto", timeout=10).api
    return docker.APIClient(base_url=url, version=version or "auto", timeout=10)


def parse_duration(text: str | float) -> float:
    """Seconds in ``"90"``, ``"30s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1w"``, or combinations like ``"1h30m"``."""
    if isinstance(text, (int, float)):
        return float(text)
    units = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    spec = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw]?)", spec)
    if not spec or "".join(n + u for n, u in parts) != spec:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 90, 30m, 2h, 1d)", "older_than")
    return sum(float(n) * units[u] for n, u in parts)


def remove_labelled(
    run_id: str | None = None,
    older_than: str | float | None = None,
    engine: str = "docker",
    *,
    include_live: bool = False,
    base_url: str | None = None,
    rollout_id: str | None = None,
) -> list[str]:
    """Force-remove our containers (running or not): those of ``run_id`` (all runs if none), only of
    ``rollout_id`` if given, created more than ``older_than`` ago if given. Containers whose creating
    process is still alive are kept unless ``include_live``. Returns the names removed."""
    max_age = None if older_than is None else parse_duration(older_than)
    api = engines.client(engine, base_url).api
    labels_wanted = [RUN_LABEL if run_id is None else f"{RUN_LABEL}={run_id}"]
    if rollout_id is not None:
        labels_wanted.append(f"{ROLLOUT_LABEL}={rollout_id}")
    now = time.time()
    doomed = []
    for c in api.containers(all=True, filters={"label": labels_wanted}):
        labels = c.get("Labels") or {}
        if max_age is not None and now - _created(c) < max_age:
            continue
        if not include_live and owner_alive(labels):
            continue
        doomed.append((c["Id"], (c.get("Names") or [c["Id"][:12]])[0].lstrip("/")))
    removed = []
    for cid, name in doomed:
        try:
            api.remove_container(cid, force=True)
        except Exception as exc:
            if engines.status(exc) not in (404, 409):
                raise
        removed.append(name)
        untrack(cid)
    return removed


def _created(container: dict[str, Any]) -> float:
    created = container.get("Created", 0)
    return float(created) if isinstance(created, (int, float)) else 0.0


def remove_leftovers(run_id: str, engine: str = "docker", *, base_url: str | None = None) -> list[str]:
    """Remove what an earlier attempt of run ``run_id`` left behind (a crash, a SIGKILL). Only containers
    whose owner process is gone: a parallel live process of the same run keeps its own."""
    return remove_labelled(run_id=run_id, engine=engine, base_url=base_url)


def run_gc(
    run_id: str | None = None, older_than: str | float | None = None, engine: str = "docker", force: bool = False
) -> int:
    """``rollout gc``: remove leftover containers, print one line per container and a summary; the exit code."""
    try:
        removed = remove_labelled(run_id, older_than, engine, include_live=force)
    except Exception as exc:  # noqa: BLE001 - a CLI: one line, not a traceback
        print(f"rollout gc: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    for name in removed:
        print(f"removed {name}")
    scope = f"run {run_id}" if run_id else "all runs"
    print(f"{len(removed)} container(s) removed ({engine}, {scope})")
    return 0
