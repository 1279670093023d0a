"""Whether the process that created a container still lives: its host and pid, and its start time against pid
reuse (read from /proc; a zombie counts as dead)."""

from __future__ import annotations

import os
import socket

OWNER_LABEL = "rollout-farm.owner"
"""``<hostname>:<pid>`` of the process that created the container."""
OWNER_START_LABEL = "rollout-farm.owner-start"
"""That process's start time (clock ticks since boot), so a recycled pid is not mistaken for the owner."""


def _start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (0 where /proc is unavailable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # Field 22; the command name (field 2) may contain spaces, so count from its closing parenthesis.
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _is_zombie(pid: int) -> bool:
    """A process that has exited but not yet been reaped (state Z): dead for our purposes."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] in (b"Z", b"X")


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process that created a container may still be running. Unknown hosts count as alive:
    their containers die by their TTL or by an explicit ``rollout gc --force``."""
    host, _, pid_text = labels.get(OWNER_LABEL, "").rpartition(":")
    if not host or not pid_text.isdigit():
        return False  # not ours to protect: no owner recorded
    if host != socket.gethostname():
        return True
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _is_zombie(pid):
        return False
    recorded = labels.get(OWNER_START_LABEL, "")
    return not (recorded.isdigit() and int(recorded) and _start_ticks(pid) not in (0, int(recorded)))
