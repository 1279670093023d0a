"""Slots: how many rollouts a node runs at once, from what one rollout takes and what the node has."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

SLOTS_PER_WORKER = 1000
"""Slots one worker process takes by default: one Python event loop runs about a thousand steps a second
(the farm's whole per-step cost is about a millisecond of it), so ten thousand rollouts whose model answers
in ten seconds keep one loop busy; past that a node gets another worker, up to one per CPU."""


@dataclass
class Resources:
    """What one rollout takes on a node; None means that resource does not limit it."""

    cpus: float | None = None
    memory_bytes: int | None = None
    max_per_node: int | None = None
    workers_per_node: int | None = None
    """Worker processes per node; None: one per ``SLOTS_PER_WORKER`` slots, up to the node's CPUs."""
    node_resources: dict[str, float] = field(default_factory=dict)
    """The Ray resources a node must offer to host rollout workers (``farm.node_resources``, e.g. ``{sandbox: 1}``)."""

    def hosts(self, node_resources: dict[str, float]) -> bool:
        """Whether a node offering ``node_resources`` gets rollout workers: it has CPUs and every resource asked."""
        return node_resources.get("CPU", 0) > 0 and all(node_resources.get(name, 0) >= amount
                                                        for name, amount in self.node_resources.items())

    def capacity(self, node_resources: dict[str, float], ceiling: int) -> int:
        limits = [ceiling]
        if self.cpus:
            limits.append(int(node_resources.get("CPU", 0) / self.cpus + 1e-9))
        if self.memory_bytes:
            limits.append(int(node_resources.get("memory", 0) // self.memory_bytes))
        if self.max_per_node:
            limits.append(self.max_per_node)
        return max(1, min(limits))

    def workers(self, node_resources: dict[str, float], capacity: int) -> list[int]:
        """The node's slots split among its worker processes (one event loop each)."""
        if self.workers_per_node:
            count = self.workers_per_node
        else:
            count = min(int(node_resources.get("CPU", 1)), capacity // SLOTS_PER_WORKER)
        count = max(1, min(count, capacity))
        return [capacity // count + (1 if i < capacity % count else 0) for i in range(count)]


@dataclass
class Node:
    node_id: str
    capacity: int
    index: int = 0
    """Which of the node's workers (``Resources.workers``) this is."""
    used: int = 0
    actor: Any = None
    channel: Any = None
    """The driver's end of the worker's mailbox (``cluster.workers.channel.Channel``)."""
    worker: str | None = None
    """``<hostname>:<pid>`` of the live worker process."""
    generation: int = 0
    alive: bool = True
    unreachable_at: float | None = None
    """When the farm gave up on the node while Ray still listed it (``cluster.workers.membership``), or None."""
    starting: asyncio.Task | None = None
    ran: int = 0
    lost_workers: list[str] = field(default_factory=list)
    sick: str | None = None
    """Why the node gets no rollouts although it is alive (``cluster.placement.health``), or None."""
    strikes: int = 0
    images: set[str] = field(default_factory=set)
    """The images the node holds, as far as the driver knows (``cluster.placement.locality``)."""
    seconds: float | None = None
    """A running mean of the seconds its attempts took (their ``total``), None before the first."""

    def note_seconds(self, seconds: float | None) -> None:
        if seconds is not None:
            self.seconds = seconds if self.seconds is None else 0.9 * self.seconds + 0.1 * seconds

    @property
    def free(self) -> int:
        return self.capacity - self.used if self.alive and self.actor is not None and self.sick is None else 0


def parse_memory(text: str | None) -> int | None:
    """``"2g"`` → bytes (docker's memory syntax)."""
    if not text:
        return None
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower()
    factor = units.get(text[-1], 1)
    number = text[:-1] if text[-1] in units else text
    return int(math.ceil(float(number) * factor))


def describe_nodes(nodes: Iterable[Node]) -> str:
    """``2 node(s), slots per node: 1a2b3c4dx8, 5e6f7a8bx8 (2 workers)``."""
    per_node: dict[str, list[int]] = {}
    for n in nodes:
        if n.alive:
            per_node.setdefault(n.node_id, []).append(n.capacity)
    parts = [f"{node_id[:8]}x{sum(slots)}" + (f" ({len(slots)} workers)" if len(slots) > 1 else "")
             for node_id, slots in per_node.items()]
    return f"{len(parts)} node(s), slots per node: {', '.join(parts)}"


def running(nodes: Iterable[Node]) -> int:
    """Rollouts running on ``nodes``: a worker runs at most its slots, the rest of what it was sent waits there."""
    return sum(min(n.used, n.capacity) for n in nodes if n.alive)


AHEAD_MAX_SECONDS = 60.0
"""Rollouts are sent ahead only to a worker whose attempts take less than this on average. Sent ahead, a rollout
saves the round trip to the driver when a slot frees (milliseconds; a second or two at 10,000 in flight) but is
bound to its worker: at a batch's end it may wait there for a slot while another node idles, up to one
attempt's time. For rollouts of minutes the saving is nothing and that wait is not."""


def queue_on(nodes: Iterable[Node], image: str | None, avoid: str | None) -> Node | None:
    """A full worker to send a rollout ahead to (it starts there when a slot frees), each holding up to one per
    slot: the one with the shortest wait, holding the rollout's image, whose attempts are short
    (``AHEAD_MAX_SECONDS``), not ``avoid`` while another will do; None to wait."""
    full = [n for n in nodes if n.alive and n.actor is not None and n.sick is None
            and n.capacity <= n.used < 2 * n.capacity and (image is None or image in n.images)
            and n.seconds is not None and n.seconds < AHEAD_MAX_SECONDS]
    if avoid is not None and any(n.node_id != avoid for n in full):
        full = [n for n in full if n.node_id != avoid]
    return min(full, key=lambda n: n.used / n.capacity, default=None)
