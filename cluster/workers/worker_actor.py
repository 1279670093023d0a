"""The worker actor: ``RolloutWorker`` as a Ray actor, pinned to one node, started for a backend."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import asdict
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.transfer.files import NodeFiles
from cluster.workers.worker import RolloutWorker
from envs.images.sources import fetches
from envs.runtimes.docker.start import NOTE_SCOPE_ENV
from rollout.data import carried

_WorkerActor = None


class NodeWorker(RolloutWorker):
    """A worker on its node: it first installs how files and images reach the node (``cluster.transfer``)."""

    def __init__(self, source: Any, *, transfer: Any = None, **options: Any):
        if transfer is not None:
            transfer.install()
        super().__init__(source, **options)

    async def info(self) -> dict[str, Any]:  # type: ignore[override] - called through Ray, which awaits it
        """``RolloutWorker.info`` and the images this node's daemon holds (for locality; none without docker),
        listed off the event loop: a daemon with many images takes a quarter of a second, which the rollouts
        running here would otherwise wait out."""
        images = await asyncio.to_thread(node_images)
        return {**super().info(), "images": images}

    async def probe(self, engines: tuple[str, ...]) -> str | None:
        """None when this node's container engines answer, else why not (``cluster.placement.health``); asked off
        the event loop (a daemon that hangs would stop every rollout here for the client's timeout)."""
        return await asyncio.to_thread(probe_engines, engines)

    def transfers(self) -> dict[str, Any]:
        """What reached this node: image fetches (image, source, seconds, bytes) and the bytes of carried files (those
        the node's ``NodeFiles`` fetched; none when it has no fetcher, or another one)."""
        fetcher = carried.installed()
        return {"node_id": self.node_id, "images": [asdict(f) for f in fetches()],
                "file_bytes": fetcher.fetched if isinstance(fetcher, NodeFiles) else 0}


def probe_engines(engines: tuple[str, ...]) -> str | None:
    """None when this host's container engines answer, else why not. Asked for its info, not a ping: a daemon hung
    in its own locks (a start never returns) still answers ``/_ping``."""
    if "docker" not in engines:
        return None
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            client.info()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - the answer is the reason
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def node_images() -> list[str]:
    """The tags of this node's docker daemon, or none when it has no daemon (or none answers quickly)."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            return sorted(tag for image in client.images.list() for tag in image.tags)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - locality is an optimisation: a node it knows nothing of still gets work
        return []


def worker_actor_class() -> Any:
    global _WorkerActor
    if _WorkerActor is None:
        _WorkerActor = ray.remote(NodeWorker)
    return _WorkerActor


def spawn_worker(source_ref: Any, node_id: str, name: str, *, run_dir: str | None, run_id: str,
                 transfer: Any = None) -> Any:
    """A new worker actor on ``node_id`` (its handle; call ``info`` to know it started)."""
    return worker_actor_class().options(
        name=name,
        num_cpus=0,  # slots are counted by the backend, per node; the actor itself only waits on I/O
        max_concurrency=100_000,
        max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        # Plain asyncio, not uvloop: uvloop forks the whole worker per subprocess (19 ms vs 2.7 ms a spawn
        # at a 150 MB heap, bench_farm (b)); the job's runtime env is inherited, env vars merged.
        # The run's workers on one node say an engine note (no disk limit) once between them.
        runtime_env={"env_vars": {"RAY_USE_UVLOOP": "0", NOTE_SCOPE_ENV: note_scope(run_id)}},
    ).remote(source_ref, node_id=node_id, run_dir=run_dir, metrics_run=run_id, transfer=transfer)


def note_scope(run_id: str) -> str:
    """This run's session (this driver process, this run): its workers share it (``NOTE_SCOPE_ENV``)."""
    return f"{run_id}@{socket.gethostname()}:{os.getpid()}"
