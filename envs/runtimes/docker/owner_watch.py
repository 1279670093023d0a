"""The owner's watchdog: a small process that outlives the process creating containers and, once that process
is gone (however it died), removes every container labelled as its own, the ones never started included.

The dead-man's switch removes a started container within a second of its owner's death; a container created but
not yet started when the owner was SIGKILLed has no switch and would wait for ``rollout gc``. One watchdog per
owner process and engine, started before its first container is created:

    python -m envs.runtimes.docker.owner_watch <pid> <start ticks> <engine> [<base_url>]
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

from envs.runtimes.docker import engines
from envs.runtimes.docker.owners import OWNER_LABEL, _is_zombie, _start_ticks

WITH_OWNER_LABEL = "rollout-farm.dies-with-owner"
"""On containers that must not outlive their owner (``die_with_owner``); the watchdog removes only those."""
POLL = 0.2
"""Seconds between looks at the owner where the kernel cannot tell us (no pidfd)."""
UNANSWERED_FOR, RETRY_EVERY = 900.0, 5.0
"""How long the watchdog keeps asking an engine that does not answer once the owner is gone (a daemon restarting or
hung when its owner died: what it created is removed once it answers again), and how often."""

_started: set[tuple[str, str | None]] = set()


def ensure_watchdog(engine: str, base_url: str | None) -> None:
    """Start this process's watchdog for ``engine`` once (before its first container: nothing of ours can then
    be left by a kill). Failing to start one is not fatal: the switch, the exit hooks and ``rollout gc`` remain."""
    key = (engine, base_url)
    if key in _started:
        return
    _started.add(key)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", "envs.runtimes.docker.owner_watch", str(os.getpid()), str(_start_ticks(os.getpid())),
            engine, *([base_url] if base_url else [])]
    try:
        subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        pass


def wait_for_death(pid: int, ticks: int) -> None:
    """Return once ``pid`` (started at ``ticks``) is gone: exited, a zombie, or its pid reused."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        if _is_zombie(pid) or (ticks and _start_ticks(pid) not in (0, ticks)):
            return
        if fd is not None:
            select.select([fd], [], [], 5.0)  # readable when the process exits
        else:
            time.sleep(POLL)


def remove_owned(pid: int, engine: str, base_url: str | None) -> int:
    """Force-remove every container ``pid`` created on this host to die with it; how many."""
    api = engines.client(engine, base_url).api
    owner = f"{socket.gethostname()}:{pid}"
    removed = 0
    wanted = [f"{OWNER_LABEL}={owner}", f"{WITH_OWNER_LABEL}=1"]
    for container in api.containers(all=True, filters={"label": wanted}):
        try:
            api.remove_container(container["Id"], force=True)
            removed += 1
        except Exception:  # noqa: BLE001 - already gone (auto-remove won the race): fine
            pass
    return removed


def main(argv: list[str]) -> int:
    pid, ticks, engine = int(argv[0]), int(argv[1]), argv[2]
    base_url = argv[3] if len(argv) > 3 else None
    wait_for_death(pid, ticks)
    time.sleep(0.5)  # the switch's own removals go first; what is left is ours
    deadline = time.monotonic() + UNANSWERED_FOR
    while True:
        try:
            remove_owned(pid, engine, base_url)
            return 0
        except Exception:  # noqa: BLE001 - the engine did not answer (restarting, hung): again, until it does
            if time.monotonic() > deadline:
                return 1
            time.sleep(RETRY_EVERY)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
