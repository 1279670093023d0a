"""What a node's worker installs so files and images reach it (``NodeTransfer``), and the run's ``images`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import field_validator

from envs.images import sources
from envs.images.image_gc import parse_size
from envs.images.instance_images import set_node_budget
from envs.images.registry import RegistrySource, registry_problem
from rollout.config.load import StrictModel
from rollout.data.carried import set_fetcher

if TYPE_CHECKING:  # it imports ray; the run's config, which holds ``ImagesSection``, loads without it
    from cluster.transfer.files import FileCarrier


class ImagesSection(StrictModel):
    """``images:`` — how images reach the nodes of a farm across machines."""

    registry: str | None = None
    """``HOST:PORT/prefix``: ``rollout images build --registry`` pushes there and nodes pull what they lack.
    Credentials: ``ROLLOUT_REGISTRY_USERNAME`` / ``ROLLOUT_REGISTRY_PASSWORD``, or each machine's docker login."""
    through_ray: bool = True
    """Without the image in the registry (or with none): load it from the driver machine's daemon through the
    object store (``docker save`` once, ``docker load`` on each node that lacks it)."""

    locality: bool = True
    """Send a rollout to a node that already holds its image, among the nodes with a free slot."""
    node_disk_budget: str | None = None
    """Disk the per-instance images may take on each node, e.g. ``40G``: the least recently used ones (never one in
    use) are removed beyond it after each build or fetch. Default: the environment's ``image_budget``, else none."""

    @field_validator("node_disk_budget")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)  # a ValueError names the bad text; pydantic adds the field
        return value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is not None and registry_problem(value):
            raise ValueError(registry_problem(value))
        return value


@dataclass
class NodeTransfer:
    """Handed to every worker (it pickles: an actor handle and names): installed in the worker's process."""

    depot: Any = None
    registry: str | None = None
    through_ray: bool = True
    node_disk_budget: str | None = None

    def install(self) -> None:
        chosen: list[sources.ImageSource] = []
        if self.registry:
            chosen.append(RegistrySource(self.registry))
        if self.depot is not None:
            from cluster.transfer.files import NodeFiles  # imports ray

            set_fetcher(NodeFiles(self.depot))
            if self.through_ray:
                from cluster.transfer.images import DepotImages  # imports ray

                chosen.append(DepotImages(self.depot))
        sources.install(*chosen)
        if self.node_disk_budget:
            set_node_budget(parse_size(self.node_disk_budget))


def open_transfer(images: ImagesSection | None) -> tuple[NodeTransfer, FileCarrier]:
    """A run's depot started on this node: ``(what each worker installs, the driver's file carrier)``."""
    from cluster.transfer.depot import start_depot  # imports ray
    from cluster.transfer.files import FileCarrier  # imports ray

    section = images or ImagesSection()
    depot = start_depot()
    return NodeTransfer(depot, section.registry, section.through_ray, section.node_disk_budget), FileCarrier(depot)


def transfer_summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """What reached the nodes during a run, from each worker's ``transfers()``: per node and in total, the images
    fetched (how many, from which source, seconds, bytes) and the bytes of carried files."""
    by_node: dict[str, dict[str, Any]] = {}
    for report in reports:
        node = by_node.setdefault(report["node_id"], {"images": 0, "seconds": 0.0, "bytes": 0, "file_bytes": 0,
                                                      "by_source": {}})
        node["file_bytes"] += report.get("file_bytes", 0)
        for fetch in report.get("images", []):
            node["images"] += 1
            node["seconds"] = round(node["seconds"] + fetch["seconds"], 3)
            node["bytes"] += fetch["bytes"]
            node["by_source"][fetch["source"]] = node["by_source"].get(fetch["source"], 0) + 1
    total = {key: sum(n[key] for n in by_node.values()) for key in ("images", "bytes", "file_bytes")}
    total["seconds"] = round(sum(n["seconds"] for n in by_node.values()), 3)
    return {"total": total, "by_node": by_node}
