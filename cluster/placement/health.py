"""Node health: a node whose sandboxes cannot start (its docker daemon died while its raylet lives) stops getting
rollouts after ``STRIKES`` such failures in a row, instead of failing every rollout sent there; the driver says so,
asks the node's worker every refresh whether its engine answers again, and sends it work once it does. A retried
attempt goes to another node than the one its last attempt failed on, when another is alive."""

from __future__ import annotations

import asyncio
from typing import Iterable, TextIO

from cluster.placement.slots import Node
from rollout.errors import ExitReason
from rollout.records import RolloutResult

STRIKES = 2
"""Container starts failed in a row on one node before it gets no more rollouts."""


class NodeHealth:
    def __init__(self, engines: tuple[str, ...], out: TextIO):
        self.engines, self.out = engines, out
        self.failed_on: dict[str, str] = {}
        """Rollout id -> the node its last attempt failed on (infrastructure)."""
        self.said_sick: set[str] = set()
        """The nodes said to get no rollouts (once per node, whatever its number of worker shares)."""

    def note(self, node: Node, result: RolloutResult) -> None:
        if result.status == "completed":
            node.strikes = 0
            self.failed_on.pop(result.rollout_id, None)
            return
        self.failed_on[result.rollout_id] = node.node_id
        if result.exit_reason != ExitReason.CONTAINER_START_FAILED:
            return
        node.strikes += 1
        if node.strikes >= STRIKES and node.sick is None:
            node.sick = (result.error.message if result.error else "container start failed").splitlines()[0][:300]
            if node.node_id in self.said_sick:
                return
            self.said_sick.add(node.node_id)
            print(f"[farm] node {node.node_id[:8]}: {node.strikes} sandboxes in a row did not start ({node.sick}); "
                  "it gets no rollouts until its container engine answers again", file=self.out, flush=True)

    def avoid(self, rollout_id: str) -> str | None:
        return self.failed_on.get(rollout_id)

    async def recheck(self, nodes: Iterable[Node]) -> bool:
        """Ask each sick node's worker whether its engine answers; whether any node is well again."""
        sick = [n for n in nodes if n.sick is not None and n.alive and n.actor is not None and n.index == 0]
        answers = await asyncio.gather(*(n.actor.probe.remote(self.engines) for n in sick), return_exceptions=True)
        healed = False
        for node, problem in zip(sick, answers):
            if problem is None:
                self.said_sick.discard(node.node_id)
                print(f"[farm] node {node.node_id[:8]}: its container engine answers again; it gets rollouts",
                      file=self.out, flush=True)
                for same in nodes:
                    if same.node_id == node.node_id:
                        same.sick, same.strikes = None, 0
                healed = True
        return healed
