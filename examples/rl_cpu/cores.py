"""Where the loop's CPU goes: the machine's busy share over a stretch of time (``CpuClock``), and a split of the
cores between the trainer and everything Ray starts (``split_cores``: the engine, Serve, the farm's workers),
as a trainer on its own accelerators and a rollout tier on others would have it.

Linux only (``/proc/stat``, ``sched_setaffinity``); elsewhere the clock reads nothing and the split refuses.
"""

from __future__ import annotations

import os
from pathlib import Path


def _jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class CpuClock:
    """The share of the machine's CPU time that was busy between ``start()`` and ``share()`` (None off Linux)."""

    def __init__(self) -> None:
        self._at = _jiffies()

    def start(self) -> CpuClock:
        self._at = _jiffies()
        return self

    def share(self) -> float | None:
        now = _jiffies()
        if now is None or self._at is None or now[1] == self._at[1]:
            return None
        return (now[0] - self._at[0]) / (now[1] - self._at[1])


def split_cores(trainer: int) -> tuple[set[int], set[int]]:
    """The cores this process may use, as (the trainer's first ``trainer`` ones, the rest for Ray)."""
    if not hasattr(os, "sched_setaffinity"):
        raise SystemExit("--trainer-cores needs Linux's sched_setaffinity")
    cores = sorted(os.sched_getaffinity(0))
    if not 0 < trainer < len(cores):
        raise SystemExit(f"--trainer-cores {trainer}: this process may use {len(cores)} cores; leave Ray at least one")
    return set(cores[:trainer]), set(cores[trainer:])


def pin(cores: set[int]) -> None:
    """The calling thread (and the processes and threads it starts from now on) on ``cores``."""
    os.sched_setaffinity(0, cores)
