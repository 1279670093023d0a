"""A Ray backend's node membership: the cluster's node list looked at every few seconds, a worker actor started
on each node that joins (one per share of its slots), a node that leaves marked dead, and a worker that dies
replaced once its node is seen alive again, its containers removed by label. ``RayBackend`` (``ray_backend``)
schedules rollouts on the nodes this keeps."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from cluster.placement.slots import Node
from cluster.workers.channel import Channel, as_future, first_line
from cluster.workers.kept import kept_handle, kept_name, kept_prefix
from cluster.workers.mailbox import LeaseLost
from cluster.workers.reaping import reap_dead_owners
from cluster.workers.worker_actor import KeptLease, note_scope, spawn_worker
from rollout.waits import within

NODE_REFRESH_INTERVAL = 5.0
"""Seconds between looks at the cluster's node list (joined and lost nodes)."""
WORKER_START_TIMEOUT = 120.0
"""Seconds a new worker actor may take to answer its first call."""
UNREACHABLE_RETRY = 30.0
"""Seconds before a node the farm gave up on (its worker died, a new one could not start) while Ray still lists it
gets another worker: Ray notices a dead machine only after its missed heartbeats, often after the run ended."""


class NodeMembership:
    """The node half of ``RayBackend``: it sets ``nodes``, ``source_ref``, ``resources``, ``concurrency``,
    ``name``, ``run_id``, ``run_dir``, ``engines``, ``out``, ``metrics``, ``limits``, ``workers_lost``,
    ``_reap_pending``, and for kept workers (``cluster.workers.kept``) ``keep``, ``key``, ``holder``,
    ``kept_listed``, ``kept_tried``, ``workers_started``, ``workers_reused``, and wakes its slot waiters in
    ``_notify``."""

    _listed: dict[str, Any] = {}
    """The nodes alive at the last look (``_refresh_nodes``): none before the first."""
    _probes: set[asyncio.Task] = set()
    """Checks running on a lost worker's node (each instance makes its own set at its first loss)."""

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(NODE_REFRESH_INTERVAL)
            try:
                if self._reap_pending:  # a dead worker's process may have lingered (a zombie) at the first look
                    self._reap_pending = False
                    await asyncio.to_thread(reap_dead_owners, self.run_id, self.engines, self.out)
                await self._refresh_nodes()
                if await self.health.recheck(list(self.nodes.values())):
                    await self._notify()
            except Exception as exc:  # noqa: BLE001 - a GCS hiccup must not end the run
                print(f"[farm] node refresh failed: {exc}", file=self.out, flush=True)

    async def _refresh_nodes(self) -> None:
        listed = await asyncio.to_thread(ray.nodes)
        alive = {n["NodeID"]: n for n in listed if n.get("Alive") and self.resources.hosts(n.get("Resources", {}))}
        self._listed = alive
        for node_id, info in alive.items():
            if (node_id, 0) not in self.nodes:
                capacity = self.resources.capacity(info["Resources"], self.concurrency)
                bound_by = self.resources.binding(info["Resources"], self.concurrency)
                allows = self.resources.allowances(info["Resources"])
                workers = [Node(node_id, share, index=index, bound_by=bound_by, allows=allows)
                           for index, share in enumerate(self.resources.workers(info["Resources"], capacity))]
                self.limits.join(workers, info["Resources"].get("CPU", 1), time.time())  # when farm.adaptive
                for node in workers:
                    self.nodes[(node_id, node.index)] = node
                    self._start_worker(node)
        for node in self.nodes.values():
            if node.alive and node.node_id not in alive:
                node.alive = False
                node.left_why = node.left_why or "Ray declared it dead: its health checks failed (a network " \
                                                 "partition, or the machine is down)"
                if node.index == 0:
                    print(f"[farm] node {node.node_id[:8]} left the cluster ({node.left_why}); its rollouts run "
                          "elsewhere", file=self.out, flush=True)
            elif not node.alive and node.node_id in alive and node.unreachable_at is not None \
                    and time.monotonic() - node.unreachable_at > UNREACHABLE_RETRY:
                node.alive, node.unreachable_at, node.left_why = True, None, None  # Ray still lists it: one more try
                if node.actor is None and node.starting is None:
                    self._start_worker(node)
            elif node.alive and node.actor is None and node.starting is None:
                silent = await raylet_silent(alive[node.node_id]) if node.lost_workers else None
                if silent:
                    self._unreachable(node.node_id, f"its worker died and {silent}")
                    continue
                self._start_worker(node)
        await self._notify()

    def _start_worker(self, node: Node) -> None:
        node.generation += 1
        generation = node.generation

        async def start() -> None:
            actor, info = await self._take_kept(node) if self.keep is not None else (None, None)
            try:
                if actor is None:
                    spawned = time.time()
                    actor = self._spawn(node, generation)
                    info = await within(as_future(actor.info.remote()), WORKER_START_TIMEOUT)
                    self.workers_started += 1
                    print(f"[farm] worker on node {node.node_id[:8]}: {start_split(spawned, info['started'])}",
                          file=self.out, flush=True)
            except Exception as exc:  # noqa: BLE001 - the node may be gone; the refresh loop decides
                if actor is not None:
                    ray.kill(actor, no_restart=True)
                print(f"[farm] worker on node {node.node_id[:8]} did not start (is the node gone?): "
                      f"{type(exc).__name__}: {first_line(exc)}", file=self.out, flush=True)
                if node.lost_workers and node.alive and node.generation == generation:
                    self._unreachable(node.node_id, "its worker died and a new one cannot start there")
            else:
                if node.generation == generation:
                    node.actor, node.worker = actor, info["worker"]
                    node.images = set(info.get("images") or ())
                    node.channel = Channel(actor, lambda exc: self._worker_lost(node, generation, exc),
                                           slots=node.slots, lease=self.holder)
                    if node.lost_workers:  # on its own host: what the dead worker left there (multi-host farms)
                        actor.reap_dead_owners.remote(self.run_id, self.engines)
                elif self.keep is not None:  # replaced meanwhile: free for another run
                    actor.release.remote(self.holder)
            finally:
                node.starting = None
                await self._notify()

        node.starting = asyncio.create_task(start())

    def _spawn(self, node: Node, generation: int) -> Any:
        if self.keep is None:
            name = f"{self.name}:{self.run_id}:{node.node_id[:8]}:{node.index}:{generation}"
            return spawn_worker(self.source_ref, node.node_id, name, run_dir=self.run_dir, run_id=self.run_id,
                                transfer=self.transfer)
        return spawn_worker(self.source_ref, node.node_id, kept_name(self.key, node.node_id), run_dir=self.run_dir,
                            run_id=self.run_id, transfer=self.transfer,
                            kept=KeptLease(self.holder, self.keep.ttl, self.keep.idle))

    async def _take_kept(self, node: Node) -> tuple[Any, dict | None]:
        """A kept worker of this run's key on ``node`` leased to this run (its handle and info), or ``(None,
        None)`` when there is none or every one is leased to another run."""
        prefix = kept_prefix(self.key, node.node_id)
        for name in [n for n in self.kept_listed if n.startswith(prefix) and n not in self.kept_tried]:
            self.kept_tried.add(name)  # one try per run: the node's other workers look at the others
            handle = await asyncio.to_thread(kept_handle, name)
            if handle is None:
                continue
            try:
                info = await within(as_future(handle.lease.remote(
                    self.holder, self.keep.ttl, self.source_ref, run_dir=self.run_dir, run_id=self.run_id,
                    transfer=self.transfer, note=note_scope(self.run_id))), WORKER_START_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - it exited meanwhile, or cannot answer: start one instead
                print(f"[farm] kept worker {name} did not take the lease: {type(exc).__name__}: {first_line(exc)}",
                      file=self.out, flush=True)
                continue
            if info is not None and "refused" in info:
                print(f"[farm] kept worker {name} is not reused: {info['refused']}", file=self.out, flush=True)
            elif info is not None:
                self.workers_reused += 1
                print(f"[farm] worker on node {node.node_id[:8]}: reused a kept worker ({info['worker']}, its run "
                      f"{info['leases']}), no new process", file=self.out, flush=True)
                return handle, info
        return None, None

    def _unreachable(self, node_id: str, why: str) -> None:
        """A worker died on the node and the node does not answer (its raylet's port is closed, or a new worker
        cannot start there): the farm counts the node as gone now rather than when Ray's heartbeat check says so
        (tens of seconds later, often after the run), and tries it again if Ray still lists it after
        ``UNREACHABLE_RETRY`` seconds."""
        if not any(n.alive for n in self.nodes.values() if n.node_id == node_id):
            return
        for node in self.nodes.values():
            if node.node_id == node_id:
                node.alive, node.unreachable_at, node.left_why = False, time.monotonic(), why
        print(f"[farm] node {node_id[:8]} left the cluster ({why}); its rollouts run elsewhere", file=self.out,
              flush=True)

    async def _probe_after_loss(self, node_id: str) -> None:
        """Right after a worker died: is its node there at all? (Not waiting for the next look at the nodes.)"""
        info = self._listed.get(node_id)
        silent = await raylet_silent(info) if info is not None else None
        if silent:
            self._unreachable(node_id, f"its worker died and {silent}")
            await self._notify()

    def _worker_lost(self, node: Node, generation: int, exc: BaseException) -> None:
        if node.generation != generation or node.actor is None:
            return  # already replaced after another of its calls failed
        self.workers_lost += 1
        self.metrics.inc("workers_lost")
        node.lost_workers.append(node.worker or "?")
        print(f"[farm] worker {node.worker} on node {node.node_id[:8]} died ({type(exc).__name__}); "
              "its rollouts run again, a replacement starts if the node is still there", file=self.out, flush=True)
        # Unreachable may not mean dead: make sure it runs nothing more the driver has sent elsewhere (a kept
        # worker whose lease passed to another run runs nothing of this one's any more: it stays).
        if not isinstance(exc, LeaseLost):
            ray.kill(node.actor, no_restart=True)
        node.actor, node.worker, node.channel = None, None, None
        self._reap_pending = True
        asyncio.get_running_loop().run_in_executor(None, reap_dead_owners, self.run_id, self.engines, self.out)
        if "_probes" not in vars(self):
            self._probes = set()
        probe = asyncio.get_running_loop().create_task(self._probe_after_loss(node.node_id))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)
        # The refresh loop starts the replacement once the node is seen alive on its next tick (a node that
        # died with its worker is reported dead by Ray within its health-check period, and gets none).


def start_split(spawned: float, started: dict[str, float]) -> str:
    """A new worker's start, split: Ray's part (a process, our modules imported, the arguments loaded) up to its
    ``__init__``, the ``__init__``, the node's images listed, and the calls' round trips."""
    total = time.time() - spawned
    ray_part = max(0.0, started["init_at"] - spawned)
    rest = max(0.0, total - ray_part - started["init"] - started["images"])
    return (f"a new process, started in {total:.1f}s (process and imports {ray_part:.1f}, init {started['init']:.1f}, "
            f"images listed {started['images']:.1f}, calls {rest:.1f})")


async def raylet_silent(info: dict, timeout: float = 3.0) -> str | None:
    """None when the node's raylet accepts a connection on its port (an unknown address is assumed there); else why
    not, in words that tell a dead raylet on a machine that answers (refused at once) from a machine the network
    does not reach (no answer within ``timeout``, or no route: a partition, or the machine is down)."""
    host, port = info.get("NodeManagerAddress"), info.get("NodeManagerPort")
    if not host or not port:
        return None
    try:
        _, writer = await within(asyncio.open_connection(host, int(port)), timeout)
    except ConnectionRefusedError:
        return f"its raylet is gone ({host}:{port} refuses connections)"
    except (OSError, asyncio.TimeoutError) as exc:
        how = f"no answer within {timeout:g}s" if isinstance(exc, asyncio.TimeoutError) else str(exc)
        return f"it is unreachable ({host}:{port}: {how}; a network partition, or the machine is down)"
    writer.close()
    return None
