"""The run's depot: one actor on the driver's machine from which every node fetches what lives only there.

- files a task names (``cluster.transfer.files``): the driver puts each file's bytes in the object store once and
  files the reference here under its content's digest;
- images (``cluster.transfer.images``): a ``docker save`` from the driver machine's daemon, made once per image
  and kept in the object store in pieces, handed to every node that asks (each loads it into its own daemon).

The depot owns the image pieces it made and lives as long as the driver; nothing in it is written to disk.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.transfer.images import export_image


class Depot:
    def __init__(self, docker_host: str | None = None):
        if docker_host:
            os.environ["DOCKER_HOST"] = docker_host
        self.files: dict[str, list[Any]] = {}
        self.images: dict[str, asyncio.Future] = {}
        self.served: dict[str, int] = {}
        """How many times each image was handed out (one per node that lacked it)."""

    def add_file(self, digest: str, boxed: list[Any]) -> None:
        """``boxed``: ``[ObjectRef]`` (in a list, so Ray hands the reference over rather than the bytes)."""
        self.files[digest] = boxed

    def file(self, digest: str) -> list[Any] | None:
        return self.files.get(digest)

    async def image(self, tag: str) -> list[Any] | None:
        """The pieces of ``tag``'s ``docker save`` (object references), saved on first ask; None when this
        machine's daemon has not got it (or there is none)."""
        if tag not in self.images:
            self.images[tag] = asyncio.ensure_future(asyncio.to_thread(export_image, tag))
        try:
            pieces = await asyncio.shield(self.images[tag])
        except Exception:
            del self.images[tag]  # a failed save is tried again by the next ask
            raise
        if pieces is None:
            del self.images[tag]  # it may be built here later
            return None
        self.served[tag] = self.served.get(tag, 0) + 1
        return pieces

    def stats(self) -> dict[str, Any]:
        return {"files": len(self.files), "images_saved": sorted(self.images), "images_served": dict(self.served)}


def start_depot() -> Any:
    """The run's depot, on this (the driver's) node, with this process's docker daemon."""
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(Depot).options(
        num_cpus=0, max_concurrency=1000, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
    return actor.remote(os.environ.get("DOCKER_HOST"))
