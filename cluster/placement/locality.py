"""Image locality: a rollout goes to a node that already holds its image, among the nodes with a free slot.

What a node holds is what its worker listed when it started (``NodeWorker.info``) plus the image of every rollout
sent there since (that rollout fetched or built it). When a slot frees, the waiting rollouts take it in this order:
one whose image the node holds; one whose image no node holds (it must be fetched somewhere); only then one whose
image is on another, busy node (a second fetch of it). Whoever is passed over takes the node in the same round of
wake-ups, so a free node is never left idle while rollouts wait: locality reorders who goes where, it never
starves a node.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable

from cluster.placement.slots import Node, besides
from rollout.records import Task


class ImageLocality:
    def __init__(self, image_of: Callable[[Task], str | None] | None = None):
        self.image_of = image_of
        self.wanting: Counter[str] = Counter()
        """Images of the rollouts waiting for a slot."""
        self.hits = self.misses = 0

    def key(self, task: Task) -> str | None:
        if self.image_of is None:
            return None
        try:
            return self.image_of(task)
        except Exception:  # noqa: BLE001 - a task whose image cannot be named is placed without locality
            return None

    def choose(self, nodes: Iterable[Node], image: str | None, avoid: str | None = None) -> Node | None:
        """The node a rollout of ``image`` takes now, or None to wait. ``avoid``: a node id not to take while another
        node is alive and well (where the rollout's last attempt failed: ``slots.besides``)."""
        nodes = besides(nodes, avoid)
        free = [n for n in nodes if n.free > 0]
        if not free:
            return None
        if image is None:
            return max(free, key=lambda n: n.free)
        holding = [n for n in free if image in n.images]
        if holding:
            self.hits += 1
            return max(holding, key=lambda n: n.free)
        spare = [n for n in free if not self._reserved(n)]
        if not spare:
            return None
        if self._new_images_waiting(nodes, image):
            return None  # its image is on a busy node: a waiting rollout of an image no node has goes first
        self.misses += 1
        return max(spare, key=lambda n: (n.free, -len(n.images)))

    def _reserved(self, node: Node) -> bool:
        return any(count > 0 and image in node.images for image, count in self.wanting.items())

    def _new_images_waiting(self, nodes: list[Node], image: str) -> bool:
        """``image`` is held by a (busy) node while another waiting rollout's image is held by none: that one
        has to be fetched somewhere anyway, this one would be fetched twice."""
        held = set().union(*(n.images for n in nodes if n.alive))
        return image in held and any(count > 0 and other != image and other not in held
                                     for other, count in self.wanting.items())

    def sent(self, node: Node, image: str | None) -> None:
        if image is not None:
            node.images.add(image)  # the rollout fetches or builds it there
