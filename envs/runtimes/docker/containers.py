"""Container bookkeeping: labels, the live-container tracker (freed at exit, on SIGTERM), garbage collection."""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

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

_EXIT_REMOVE_WAIT = 20.0
"""Seconds the exit-time cleanup may take before giving up (the TTL catches what it misses)."""

# container id -> (engine, base_url, name). Plain dict operations, atomic under the GIL: no lock, so the
# SIGTERM handler can never deadlock on one the interrupted code holds.
_live: dict[str, tuple[str, str | None, str]] = {}
_others: dict[str, Callable[[], None]] = {}
"""What else this process started and must stop at exit or on SIGTERM (apptainer instances): key -> a blocking
stop."""
_atexit_installed = False
_sigterm_installed = False
_previous_sigterm: Any = None


def owner_labels() -> dict[str, str]:
    """Labels naming this process as the owner of the containers it creates."""
    labels = {OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}", OWNER_START_LABEL: str(_start_ticks(os.getpid()))}
    node = os.environ.get(NODE_ENV)
    if node:
        labels[NODE_LABEL] = node
    return labels


def track(container_id: str, engine: str, base_url: str | None, name: str) -> None:
    """Remember a live container; it is removed at interpreter exit or on SIGTERM unless ``untrack``ed first."""
    install_hooks()
    _live[container_id] = (engine, base_url, name)


def untrack(container_id: str) -> None:
    _live.pop(container_id, None)


def track_other(key: str, stop: Callable[[], None]) -> None:
    """Stop something else (an apptainer instance) at interpreter exit or on SIGTERM unless ``untrack_other``ed."""
    install_hooks()
    _others[key] = stop


def untrack_other(key: str) -> None:
    _others.pop(key, None)


def tracked() -> list[str]:
    """Names of the containers this process has started and not closed."""
    return [name for _, _, name in list(_live.values())]


def remove_tracked() -> list[str]:
    """Force-remove every tracked container, in parallel; returns their names. Lock-free: it runs inside
    a signal handler, which may interrupt the main thread anywhere (even inside the SDK's own locks),
    so it uses fresh clients from new threads and gives up after a bound."""
    entries = list(_live.items())
    _live.clear()
    others = list(_others.values())
    _others.clear()
    if not entries and not others:
        return []
    versions = {(e, u): c.api.api_version for e, u, c in engines.cached_clients()}

    def remove(item: tuple[str, tuple[str, str | None, str]]) -> None:
        cid, (engine, url, _) = item
        try:
            _fresh_api(engine, url, versions.get((engine, url))).remove_container(cid, force=True)
        except Exception:  # noqa: BLE001 - already gone, or the engine is down: the TTL reaps it
            pass

    def stop(item: Callable[[], None]) -> None:
        try:
            item()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass

    # Plain threads, not an executor: at interpreter exit, executors refuse new work.
    jobs = [(remove, (item,)) for item in entries] + [(stop, (other,)) for other in others]
    threads = [threading.Thread(target=fn, args=args, daemon=True) for fn, args in jobs]
    deadline = time.monotonic() + _EXIT_REMOVE_WAIT
    for thread, (fn, args) in zip(threads, jobs):
        try:
            thread.start()
        except RuntimeError:  # no new threads this late in shutdown: do it here
            fn(*args)
    for thread in threads:
        if thread.ident is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [name for _, (_, _, name) in entries]


def _fresh_api(engine: str, base_url: str | None, version: str | None) -> Any:
    import docker

    url = base_url or (engines.podman_url() if engine == "podman" else None)
    if url is None:
        return docker.from_env(version=version or "auto", timeout=10).api
    return docker.APIClient(base_url=url, version=version or "auto", timeout=10)


def install_hooks() -> None:
    """atexit and SIGTERM cleanup, installed on first container start (never at import: Ray re-imports us
    everywhere). SIGTERM needs the main thread: from another one (an async Ray actor's loop) only atexit and
    the TTL remain, and a later call from the main thread completes the job."""
    global _atexit_installed, _sigterm_installed, _previous_sigterm
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(remove_tracked)
    if not _sigterm_installed and threading.current_thread() is threading.main_thread():
        _sigterm_installed = True
        _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    remove_tracked()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # the default action: die of SIGTERM, as if we had never been here
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


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
