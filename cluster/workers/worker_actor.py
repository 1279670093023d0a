"""The worker actor: ``RolloutWorker`` as a Ray actor, pinned to one node, started for a backend."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.session.connect import PROJECT_ROOT
from cluster.transfer.files import NodeFiles
from cluster.workers.kept import KEPT_NAMESPACE, changed_code, loaded_code
from cluster.workers.worker import RolloutWorker
from envs.images.sources import fetches
from envs.runtimes.docker.start import NOTE_SCOPE_ENV
from rollout.data import carried

_WorkerActor = None
WATCH_INTERVAL = 5.0
"""Seconds between a kept worker's looks at its lease and its idle time."""


class NodeWorker(RolloutWorker):
    """A worker on its node: it first installs how files and images reach the node (``cluster.transfer``). Kept
    (``idle`` seconds given: ``cluster.workers.kept``), it is leased to one run at a time and binds each anew."""

    def __init__(self, source: Any, *, transfer: Any = None, note: str | None = None, holder: str | None = None,
                 ttl: float = 0.0, idle: float | None = None, **options: Any):
        began = time.time()
        self._install(transfer, note)
        super().__init__(source, **options)
        self.started = {"init_at": began, "init": time.time() - began}
        """When its ``__init__`` began (wall clock) and how long it took: the driver splits a start with them."""
        self.holder, self.expires = holder, time.monotonic() + ttl
        self.idle = idle
        """Seconds this kept worker waits without a lease before it exits; None: not kept (its run ends it)."""
        self.idle_since = time.monotonic()
        self.leases = 1
        """Runs that leased it, this one included."""
        self._turn = asyncio.Lock()
        self._watcher: asyncio.Task | None = None
        self._code = loaded_code()
        """The project's files this process imported, as they were then (``cluster.workers.kept.changed_code``)."""
        self._listed: asyncio.Future | None = None
        """The node's images, listed when the last lease ended: the next run's ``info`` takes them, not waiting for
        a listing (a quarter of a second of its start-up; an image added meanwhile is one locality misses)."""

    def _install(self, transfer: Any, note: str | None) -> None:
        if transfer is not None:
            transfer.install()
        self._fetched_before = len(fetches())  # what reached the node for an earlier run is not this run's
        if note is not None:
            os.environ[NOTE_SCOPE_ENV] = note

    async def lease(self, holder: str, ttl: float, source: Any, *, run_dir: str | None, run_id: str,
                    transfer: Any = None, note: str | None = None) -> dict[str, Any] | None:
        """Take this kept worker for ``holder``'s run for ``ttl`` seconds (``renew`` extends it): its ``info``, or
        None while another run holds it. A lease that expired (its driver stopped renewing) ends first: what it ran
        is cancelled and its containers removed. Everything of a run is bound anew (``RolloutWorker._bind``)."""
        async with self._turn:
            if self.holder is not None and time.monotonic() < self.expires:
                return None
            self._watch()
            if self.holder is not None:
                await self._end_lease()
            changed = changed_code(self._code)
            if changed:  # stale for every later run too: make room for a new process
                asyncio.get_running_loop().call_later(0.5, self._exit)
                return {"refused": f"{len(changed)} source file(s) changed since it imported them, e.g. "
                                   f"{os.path.relpath(changed[0], PROJECT_ROOT)}"}
            self._install(transfer, note)
            self._bind(source, run_dir=run_dir, metrics_run=run_id, holder=holder)
            self.expires = time.monotonic() + ttl
            self.leases += 1
        return await self.info()

    def renew(self, holder: str, ttl: float) -> bool:
        """Extend ``holder``'s lease by ``ttl`` seconds from now; False when it holds this worker no more."""
        if self.holder != holder:
            return False
        self.expires = time.monotonic() + ttl
        return True

    async def release(self, holder: str) -> bool:
        """``holder``'s run is over: stop what it still runs here, close what it opened (``shutdown``), and wait
        for the next lease, or exit after ``idle`` seconds."""
        async with self._turn:
            if self.holder != holder:
                return False
            await self._end_lease()
        return True

    async def _end_lease(self) -> None:
        await self.shutdown()
        self._code = loaded_code(self._code)  # the modules the run imported, as they were
        self._open_mailbox(None)
        self.idle_since = time.monotonic()
        self._listed = asyncio.ensure_future(asyncio.to_thread(node_images))

    def _watch(self) -> None:
        if self._watcher is None and self.idle is not None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_leases())

    async def _watch_leases(self) -> None:
        """Ends an expired lease (its driver died) and exits once idle for ``idle`` seconds."""
        while True:
            await asyncio.sleep(max(0.2, min(WATCH_INTERVAL, self.idle / 4)))
            async with self._turn:
                now = time.monotonic()
                if self.holder is not None and now >= self.expires:
                    print(f"[farm] the lease of {self.holder} expired (its driver is gone): its rollouts here stop",
                          flush=True)
                    await self._end_lease()
                elif self.holder is None and now - self.idle_since >= self.idle:
                    print(f"[farm] kept worker idle for {self.idle:g}s: exiting", flush=True)
                    self._exit()
                    return

    def _exit(self) -> None:
        """End this kept worker's actor (its name is free again)."""
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def info(self) -> dict[str, Any]:  # type: ignore[override] - called through Ray, which awaits it
        """``RolloutWorker.info`` and the images this node's daemon holds (for locality; none without docker),
        listed off the event loop: a daemon with many images takes a quarter of a second, which the rollouts
        running here would otherwise wait out."""
        self._watch()
        began = time.perf_counter()
        listed, self._listed = self._listed, None
        images = await (listed if listed is not None else asyncio.to_thread(node_images))
        return {**super().info(), "images": images, "leases": self.leases,
                "started": {**self.started, "images": time.perf_counter() - began}}

    async def probe(self, engines: tuple[str, ...]) -> str | None:
        """None when this node's container engines answer, else why not (``cluster.placement.health``); asked off
        the event loop (a daemon that hangs would stop every rollout here for the client's timeout)."""
        return await asyncio.to_thread(probe_engines, engines)

    def transfers(self) -> dict[str, Any]:
        """What reached this node: image fetches (image, source, seconds, bytes) and the bytes of carried files (those
        the node's ``NodeFiles`` fetched; none when it has no fetcher, or another one)."""
        fetcher = carried.installed()
        return {"node_id": self.node_id, "images": [asdict(f) for f in fetches()[self._fetched_before:]],
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
                 transfer: Any = None, kept: KeptLease | None = None) -> Any:
    """A new worker actor on ``node_id`` (its handle; call ``info`` to know it started). ``kept``: detached in the
    farm's namespace and leased to this run (``cluster.workers.kept``), instead of ending with it."""
    options: dict[str, Any] = {}
    lease: dict[str, Any] = {}
    if kept is not None:
        options = {"lifetime": "detached", "namespace": KEPT_NAMESPACE}
        lease = {"holder": kept.holder, "ttl": kept.ttl, "idle": kept.idle}
    return worker_actor_class().options(
        name=name,
        num_cpus=0,  # slots are counted by the backend, per node; the actor itself only waits on I/O
        max_concurrency=100_000,
        max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        # Plain asyncio, not uvloop: uvloop forks the whole worker per subprocess (19 ms vs 2.7 ms a spawn
        # at a 150 MB heap, bench_farm (b)); the job's runtime env is inherited, env vars merged. Nothing of the
        # run's goes here: a kept worker serves later runs (their note scope is set per lease).
        runtime_env={"env_vars": {"RAY_USE_UVLOOP": "0"}},
        **options,
    ).remote(source_ref, node_id=node_id, run_dir=run_dir, metrics_run=run_id, transfer=transfer,
             note=note_scope(run_id), **lease)


@dataclass
class KeptLease:
    """How a run keeps its workers: the lease's holder and length, and how long a worker waits idle after it."""

    holder: str
    ttl: float
    idle: float


def note_scope(run_id: str) -> str:
    """This run's session (this driver process, this run): its workers share it (``NOTE_SCOPE_ENV``)."""
    return f"{run_id}@{socket.gethostname()}:{os.getpid()}"
