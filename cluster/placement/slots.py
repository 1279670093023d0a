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

RESERVED_CPUS = 1 / 32
"""CPUs a rollout in a container reserves on a node unless ``farm.cpus_per_rollout`` says: its container idles while
the model thinks (the SWE demo's sandboxes used 4 % of a CPU at the median and 18 % at most, grading included), so
a 2-CPU node takes 64 at once. The container keeps its own ``cpus`` limit; a smaller one is reserved instead."""
RESERVED_MEMORY = "128m"
"""Memory a rollout in a container reserves on a node unless ``farm.memory_per_rollout`` says (the SWE demo's
sandboxes peaked at 25 MiB); the container keeps its own ``memory`` limit; a smaller one is reserved instead."""


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
    keys: dict[str, str] = field(default_factory=dict)
    """Where ``cpus`` and ``memory`` came from, as the user would write it (``runtime.cpus=1.0`` when the farm took
    the container's limit, ``farm.cpus_per_rollout=0.25`` when the farm says), for the line that says what binds."""
    adaptive_window: float | None = None
    """``farm.adaptive``: each node's limit is found by measuring (``cluster.placement.adaptive``), judged over
    windows of at least this many seconds (``farm.adaptive_window``); None: a node runs up to its capacity."""

    def hosts(self, node_resources: dict[str, float]) -> bool:
        """Whether a node offering ``node_resources`` gets rollout workers: it has CPUs and every resource asked."""
        return node_resources.get("CPU", 0) > 0 and all(node_resources.get(name, 0) >= amount
                                                        for name, amount in self.node_resources.items())

    def limits(self, node_resources: dict[str, float]) -> dict[str, int]:
        """How many rollouts at once each limit allows on a node offering ``node_resources``, by what sets it
        (``runtime.cpus=1.0 on 2 CPUs``: 2)."""
        found = {}
        if self.cpus:
            cpus = node_resources.get("CPU", 0)
            label = self.keys.get("cpus", f"farm.cpus_per_rollout={self.cpus:g}")
            found[f"{label} on {cpus:g} CPUs"] = int(cpus / self.cpus + 1e-9)
        if self.memory_bytes:
            memory = node_resources.get("memory", 0)
            label = self.keys.get("memory", f"farm.memory_per_rollout={self.memory_bytes}")
            found[f"{label} of {memory / 2**30:.1f} GiB"] = int(memory // self.memory_bytes)
        if self.max_per_node:
            found[f"farm.max_per_node={self.max_per_node}"] = self.max_per_node
        return found

    def capacity(self, node_resources: dict[str, float], ceiling: int) -> int:
        return max(1, min([ceiling, *self.limits(node_resources).values()]))

    def allowances(self, node_resources: dict[str, float]) -> str:
        """What each limit allows on a node, in words (``farm.cpus_per_rollout=1 on 2 CPUs: 2, farm.memory_per_rollout=
        128m (its default) of 16.0 GiB: 128``)."""
        return ", ".join(f"{key}: {count}" for key, count in self.limits(node_resources).items())

    def binding(self, node_resources: dict[str, float], ceiling: int) -> str:
        """What sets a node's slots: the tightest of its limits, or ``run.concurrency=N`` when none is tighter."""
        limits = self.limits(node_resources)
        tightest = min(limits, key=limits.__getitem__, default=None)
        return tightest if tightest is not None and limits[tightest] < ceiling else f"run.concurrency={ceiling}"

    def workers(self, node_resources: dict[str, float], capacity: int) -> list[int]:
        """The node's slots split among its worker processes (one event loop each)."""
        if self.workers_per_node:
            count = self.workers_per_node
        else:
            count = min(int(node_resources.get("CPU", 1)), capacity // SLOTS_PER_WORKER)
        return split(capacity, max(1, min(count, capacity)))


def split(total: int, count: int) -> list[int]:
    """``total`` slots shared among ``count`` workers as evenly as can be, the first ones taking the remainder."""
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


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
    left_why: str | None = None
    """Why the farm counts the node as gone (``cluster.workers.membership``), for the run's summary; None: alive."""
    """When the farm gave up on the node while Ray still listed it (``cluster.workers.membership``), or None."""
    starting: asyncio.Task | None = None
    ran: int = 0
    lost_workers: list[str] = field(default_factory=list)
    bound_by: str = ""
    """What sets the node's slots (``Resources.binding``), said when the farm describes its nodes."""
    allows: str = ""
    """What each of the node's limits allows (``Resources.allowances``), said when it binds below what is asked."""
    sick: str | None = None
    """Why the node gets no rollouts although it is alive (``cluster.placement.health``), or None."""
    strikes: int = 0
    images: set[str] = field(default_factory=set)
    """The images the node holds, as far as the driver knows (``cluster.placement.locality``)."""
    seconds: float | None = None
    """A running mean of the seconds its attempts took (their ``total``), None before the first."""
    limit: int | None = None
    """Its share of its node's adaptive limit (``farm.adaptive``, ``cluster.placement.adaptive``); None: its
    capacity."""

    def note_seconds(self, seconds: float | None) -> None:
        if seconds is not None:
            self.seconds = seconds if self.seconds is None else 0.9 * self.seconds + 0.1 * seconds

    @property
    def slots(self) -> int:
        """Rollouts it runs at once now: its capacity, or its share of its node's adaptive limit."""
        return self.capacity if self.limit is None else self.limit

    @property
    def free(self) -> int:
        return self.slots - self.used if self.alive and self.actor is not None and self.sick is None else 0


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
    """``2 nodes: node 1a2b3c4d runs up to 8 rollouts at once (runtime.cpus=1.0 on 8 CPUs), node 5e6f7a8b up to 8
    (2 worker processes; ...)``."""
    per_node: dict[str, list[Node]] = {}
    for n in nodes:
        if n.alive:
            per_node.setdefault(n.node_id, []).append(n)
    parts = []
    for k, (node_id, shares) in enumerate(per_node.items()):
        why = [f"{len(shares)} worker processes"] if len(shares) > 1 else []
        why += [shares[0].bound_by] if shares[0].bound_by else []
        runs = "runs up to " if k == 0 else "up to "
        parts.append(f"node {node_id[:8]} {runs}{sum(n.capacity for n in shares)}"
                     + (" rollouts at once" if k == 0 else "") + (f" ({'; '.join(why)})" if why else ""))
    return f"{len(parts)} node{'s' if len(parts) != 1 else ''}: {', '.join(parts)}"


def fewer_than_asked(nodes: Iterable[Node], concurrency: int) -> str | None:
    """One line when the nodes run fewer rollouts at once than ``run.concurrency`` asks, naming what binds each
    and the keys that change it; None when they run as many."""
    alive = [n for n in nodes if n.alive]
    slots = sum(n.capacity for n in alive)
    if slots >= concurrency:
        return None
    bound = sorted({n.bound_by for n in alive if n.bound_by})
    allows = sorted({n.allows for n in alive if n.allows})
    return (f"farm: {slots} rollout(s) at once, not the {concurrency} run.concurrency asks: "
            f"bound by {', '.join(bound) or 'the nodes'}"
            + (f" (per node, {'; '.join(allows)})" if allows else "") + ". "
            "farm.cpus_per_rollout and farm.memory_per_rollout reserve what one rollout takes on a node (a "
            "container's own limits stay its runtime's), "
            "farm.max_per_node caps it")


def running(nodes: Iterable[Node]) -> int:
    """Rollouts running on ``nodes``: a worker runs at most its slots, the rest of what it was sent waits there."""
    return sum(min(n.used, n.slots) for n in nodes if n.alive)


AHEAD_MAX_SECONDS = 60.0
"""Rollouts are sent ahead only to a worker whose attempts take less than this on average. Sent ahead, a rollout
saves the round trip to the driver when a slot frees (milliseconds; a second or two at 10,000 in flight) but is
bound to its worker: at a batch's end it may wait there for a slot while another node idles, up to one
attempt's time. For rollouts of minutes the saving is nothing and that wait is not."""


def besides(nodes: Iterable[Node], avoid: str | None) -> list[Node]:
    """``nodes`` without node ``avoid`` (where a rollout's last attempt failed, as infrastructure) while another node
    is alive and well: the retry runs elsewhere, or waits for a slot elsewhere, never back where it failed because
    that node had a slot first (a node whose daemon hangs fails each attempt only after a long wait)."""
    nodes = list(nodes)
    if avoid is not None and any(n.alive and n.sick is None and n.node_id != avoid for n in nodes):
        return [n for n in nodes if n.node_id != avoid]
    return nodes


def queue_on(nodes: Iterable[Node], image: str | None, avoid: str | None) -> Node | None:
    """A full worker to send a rollout ahead to (it starts there when a slot frees), each holding up to one per
    slot (its share of the node's adaptive limit, when it has one): the one with the shortest wait, holding the
    rollout's image, whose attempts are short (``AHEAD_MAX_SECONDS``), not ``avoid`` (``besides``); None to
    wait."""
    full = [n for n in besides(nodes, avoid) if n.alive and n.actor is not None and n.sick is None
            and n.slots <= n.used < 2 * n.slots and (image is None or image in n.images)
            and n.seconds is not None and n.seconds < AHEAD_MAX_SECONDS]
    return min(full, key=lambda n: n.used / n.slots, default=None)
