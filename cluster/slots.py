"""Slots: how many rollouts a node runs at once, from what one rollout takes and what the node has."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Resources:
    """What one rollout takes on a node; None means that resource does not limit it."""

    cpus: float | None = None
    memory_bytes: int | None = None
    max_per_node: int | None = None

    def capacity(self, node_resources: dict[str, float], ceiling: int) -> int:
        limits = [ceiling]
        if self.cpus:
            limits.append(int(node_resources.get("CPU", 0) / self.cpus + 1e-9))
        if self.memory_bytes:
            limits.append(int(node_resources.get("memory", 0) // self.memory_bytes))
        if self.max_per_node:
            limits.append(self.max_per_node)
        return max(1, min(limits))


@dataclass
class Node:
    node_id: str
    capacity: int
    used: int = 0
    actor: Any = None
    worker: str | None = None
    """``<hostname>:<pid>`` of the live worker process."""
    generation: int = 0
    alive: bool = True
    starting: asyncio.Task | None = None
    ran: int = 0
    lost_workers: list[str] = field(default_factory=list)

    @property
    def free(self) -> int:
        return self.capacity - self.used if self.alive and self.actor is not None else 0


def parse_memory(text: str | None) -> int | None:
    """``"2g"`` → bytes (docker's memory syntax)."""
    if not text:
        return None
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    factor = units.get(text[-1], 1)
    number = text[:-1] if text[-1] in units else text
    return int(math.ceil(float(number) * factor))
