"""The Ray backend: async worker actors on every node, a slot count per node, and the faults a farm meets.

Scheduling is ours, not ``ray.util.ActorPool``'s: each node has ``capacity`` slots (what a rollout takes against
what the node has, split among its workers), and ``execute`` waits for a free slot on the least loaded worker,
then hands the rollout to that worker's ``Channel`` (batched; never ``ray.get`` in async code). So no node runs
more containers than it can hold and every node is used. With ``farm.adaptive`` a node's slots are its adaptive
limit (``cluster.placement.adaptive``), fed each attempt that finished there and told to its workers as it changes.
Faults: a dead worker or node fails its in-flight attempts as ``worker_died`` (the driver runs them again), a
replacement starts if the node is still there, and the dead worker's containers are removed by label; an attempt
past the host-side ``deadline`` is cancelled, its containers removed, and fails as ``deadline_exceeded``; nodes that
join get a worker too.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from typing import Any, Callable, TextIO

import ray
from ray.exceptions import RayActorError

from cluster.backends.seam import Backend
from cluster.placement.adaptive import Change, NodeLimits, runs_its_limit
from cluster.placement.health import NodeHealth
from cluster.placement.locality import ImageLocality
from cluster.placement.slots import Node, Resources, describe_nodes, fewer_than_asked, queue_on, running
from cluster.transfer.setup import open_transfer, transfer_summary
from cluster.workers.channel import WorkerGone, retrieve
from cluster.workers.kept import RENEW_INTERVAL, KeepWorkers, kept_names, new_holder
from cluster.workers.mailbox import LeaseLost
from cluster.workers.membership import NodeMembership
from cluster.workers.metrics import FarmMetrics
from cluster.workers.reaping import reap_dead_owners, remove_rollout_containers
from cluster.workers.wire import decode_result
from rollout.errors import DeadlineExceeded, WorkerDied
from rollout.events import Observer
from rollout.records import RequestMeta, RolloutResult, Task
from rollout.runner import failure_result
from rollout.waits import within

CANCEL_GRACE = 30.0
"""Seconds a cancelled attempt may take to close its runtime before its containers are removed by label."""

class RayBackend(NodeMembership, Backend):
    """``Backend`` for the driver: ``execute(task, meta, observers)`` on the least loaded node's worker."""

    def __init__(self, source: Any, *, run_id: str, resources: Resources, concurrency: int,
                 deadline: float | None = None, run_dir: str | None = None, engines: tuple[str, ...] = ("docker",),
                 name: str = "rollout-worker", images: Any = None,
                 image_of: Callable[[Task], str | None] | None = None, keep: KeepWorkers | None = None,
                 out: TextIO = sys.stderr):
        self.source, self.source_ref = source, ray.put(source)
        self.keep = keep
        """Workers kept between runs on a standing cluster (``cluster.workers.kept``), or None: the run's own."""
        self.key = ""
        self.holder: str | None = None
        """This run's lease of its kept workers."""
        self.kept_listed: list[str] = []
        self.kept_tried: set[str] = set()
        self.workers_started = self.workers_reused = 0
        self._renewer: asyncio.Task | None = None
        self.images = images
        """The run's ``images`` section (``cluster.transfer.setup.ImagesSection``), or None for its defaults."""
        self.health = NodeHealth(engines, out)
        self.locality = ImageLocality(image_of if images is None or images.locality else None)
        self.limits = NodeLimits(resources.adaptive_window)
        """Each node's adaptive limit (``farm.adaptive``), when on."""
        self.transfer: Any = None
        self.files: Any = None
        self.transfers: dict[str, Any] | None = None
        self.peak = 0
        """The most rollouts that ran at once (a worker runs at most its slots)."""
        """What reached the nodes (``cluster.transfer.setup.transfer_summary``), once closed."""
        self.run_id, self.resources, self.concurrency = run_id, resources, concurrency
        self.deadline, self.run_dir, self.engines, self.name, self.out = deadline, run_dir, engines, name, out
        self.nodes: dict[tuple[str, int], Node] = {}
        """One entry per worker: (node id, index among the node's workers)."""
        self._changed: asyncio.Condition | None = None
        self._refresher: asyncio.Task | None = None
        self.workers_lost = self.deadlines_hit = 0
        self.waiting = 0
        """Rollouts admitted by the driver's window that wait for a node slot."""
        self.not_started = 0
        self._reap_pending = False
        self._seq = itertools.count()

        self.metrics = FarmMetrics(run_id)

    async def start(self) -> "RayBackend":
        self._changed = asyncio.Condition()
        self.transfer, self.files = await asyncio.to_thread(open_transfer, self.images)
        if self.keep is not None:
            self.key, self.holder = await asyncio.to_thread(self.keep.key), new_holder(self.run_id)
            self.kept_listed = await asyncio.to_thread(kept_names, self.key)
        await self._refresh_nodes()
        if not self.nodes:
            asked = self.resources.node_resources
            raise RuntimeError("the Ray cluster has no alive node with CPUs" + (f" and {asked}" if asked else "") +
                               " to run rollouts on")
        await asyncio.gather(*(n.starting for n in self.nodes.values() if n.starting is not None),
                             return_exceptions=True)
        fewer = fewer_than_asked(self.nodes.values(), self.concurrency)
        if fewer is not None:
            print(fewer, file=self.out, flush=True)
        self._refresher = asyncio.create_task(self._refresh_loop())
        if self.keep is not None:
            self._renewer = asyncio.create_task(self._renew_loop())
            print(f"[farm] workers kept for later runs (farm.keep_workers_idle={self.keep.idle:g}s): "
                  f"{self.workers_reused} reused, {self.workers_started} started", file=self.out, flush=True)
        return self

    @property
    def kept_workers(self) -> dict[str, Any] | None:
        if self.keep is None:
            return None
        return {"reused": self.workers_reused, "started": self.workers_started, "idle": self.keep.idle}

    async def _renew_loop(self) -> None:
        """Renews this run's leases; a worker that answers False was taken by another run after this one's lease
        expired (this driver stalled past it): its rollouts run again elsewhere, as a lost worker's."""
        while True:
            await asyncio.sleep(RENEW_INTERVAL)
            nodes = [n for n in self.nodes.values() if n.actor is not None]
            answers = await asyncio.gather(*(n.actor.renew.remote(self.holder, self.keep.ttl) for n in nodes),
                                           return_exceptions=True)
            for node, held in zip(nodes, answers):
                if held is False and node.channel is not None:
                    node.channel.lost(LeaseLost(f"the lease of {self.holder} expired and another run took it"))

    async def close(self) -> None:
        for task in (self._refresher, self._renewer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        nodes = [n for n in self.nodes.values() if n.actor is not None]
        self.transfers = transfer_summary(await self.broadcast("transfers"))

        async def stop(node: Node) -> None:
            if self.keep is not None:  # kept for the next run: what this run opened there closes, the process stays
                try:
                    await within(node.actor.release.remote(self.holder), 60)
                    return
                except Exception:  # noqa: BLE001 - dead or stuck: ended below like a run's own worker
                    pass
            try:
                await within(node.actor.shutdown.remote(), 60)
            except Exception:  # noqa: BLE001 - a dead worker's containers are reaped by label below
                pass
            ray.kill(node.actor, no_restart=True)

        await asyncio.gather(*(n.channel.close() for n in nodes if n.channel is not None))
        await asyncio.gather(*(stop(n) for n in nodes))
        await self.metrics.aclose()
        if self.transfer is not None:
            ray.kill(self.transfer.depot, no_restart=True)  # what it kept in the object store goes with it
        await asyncio.to_thread(reap_dead_owners, self.run_id, self.engines, self.out)

    def describe(self) -> str:
        nodes = describe_nodes(self.nodes.values())
        return f"{nodes}; {self.limits.describe()}" if self.limits.on else nodes

    def node_limits(self, last: int | None = None) -> dict[str, dict[str, Any]] | None:
        return self.limits.report(last)

    def lost_nodes(self) -> dict[str, str]:
        """The nodes that left the cluster during the run, by id: why each counts as gone."""
        first = sorted(self.nodes.values(), key=lambda n: -n.index)  # a node's first worker's reason, set last
        return {n.node_id: n.left_why or "it left the cluster" for n in first if not n.alive}

    def workers(self) -> list[Any]:
        """Handles of the live worker actors."""
        return [n.actor for n in self.nodes.values() if n.alive and n.actor is not None]

    async def broadcast(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every live worker; a dead one is skipped (its node gets a replacement)."""
        refs = [getattr(actor, method).remote(*args) for actor in self.workers()]
        out = await asyncio.gather(*refs, return_exceptions=True)
        return [r for r in out if not isinstance(r, BaseException)]

    async def live(self) -> list[dict[str, Any]]:
        """The in-flight rollouts of every live worker (``RolloutWorker.live`` rows)."""
        return [row for rows in await self.broadcast("live") for row in rows]

    async def set_model_url(self, base_url: str) -> None:
        """The model answers at ``base_url`` now (it deployed while the workers started): workers started from
        now on get it with their source, the live ones (the starting ones once up) are told."""
        self.source.base_url = base_url
        self.source_ref = ray.put(self.source)
        await asyncio.gather(*(n.starting for n in self.nodes.values() if n.starting is not None),
                             return_exceptions=True)
        await self.broadcast("set_base_url", base_url)

    async def execute(self, task: Task, meta: RequestMeta, observers: list[Observer]) -> RolloutResult:
        task = await self.files.carry(task)  # the files it names travel with it, not by path
        node, held = await self._acquire(self.locality.key(task), self.health.avoid(meta.rollout_id))
        channel, seq = node.channel, next(self._seq)
        future = channel.send(seq, task, meta)
        # sent ahead, it waits for a slot there: at most as long as a running attempt may take
        deadline = self.deadline * 2 if self.deadline is not None and node.used > node.slots else self.deadline
        try:
            # within, not wait_for: a driver's cancel landing as the result arrives would be lost (rollout.waits),
            # and its worker would go on taking rollouts after Ctrl-C or a batch deadline
            payload = await within(asyncio.shield(future), deadline)
            try:
                result = decode_result(payload) if payload is not None else failure_result(task, meta, WorkerDied(
                    f"the worker on node {node.node_id[:8]} cancelled attempt {meta.attempt} of {meta.rollout_id}"))
            except Exception as exc:  # noqa: BLE001 - a result that does not load fails its attempt, not the run
                result = failure_result(task, meta, exc)
        except asyncio.TimeoutError:
            self.deadlines_hit += 1
            channel.cancel(seq)
            # Let the worker unwind (its runtime closes what it started), then remove what is left by label.
            await asyncio.wait([future], timeout=CANCEL_GRACE)
            await asyncio.to_thread(remove_rollout_containers, self.run_id, self.engines, meta.rollout_id)
            result = failure_result(task, meta, DeadlineExceeded(
                f"attempt {meta.attempt} of {meta.rollout_id} passed the {deadline:g}s deadline on node "
                f"{node.node_id[:8]}; cancelled and its containers removed"))
        except WorkerGone as exc:
            where = f"worker {node.worker or '?'} on node {node.node_id[:8]}"
            cause = f"died: {exc}" if isinstance(exc.cause, RayActorError) else f"could not run it: {exc}"
            result = failure_result(task, meta, WorkerDied(f"{where} {cause}"))
        except asyncio.CancelledError:  # the caller gave up (a batch deadline): stop the attempt for real
            channel.cancel(seq)
            await asyncio.shield(asyncio.to_thread(remove_rollout_containers, self.run_id, self.engines,
                                                   meta.rollout_id))
            raise
        finally:
            future.add_done_callback(retrieve)  # an abandoned attempt's error is expected, never "unretrieved"
            full = self.limits.on and runs_its_limit(self._workers_of(node.node_id))  # before its slot frees
            await self._release(node)
        if result.node_id is None:
            result.node_id, result.worker = node.node_id, node.worker
        self.health.note(node, result)
        node.note_seconds(result.timings.get("total"))
        node.ran += 1
        if self.limits.on:
            workers = self._workers_of(node.node_id)
            change = self.limits.note(workers, result, held=held, full=full, at=time.time())
            if change is not None:
                await self._limit_changed(node.node_id, change)
        self.metrics.inc("attempts", status=result.status, exit_reason=result.exit_reason.value)
        return result

    async def _acquire(self, image: str | None = None, avoid: str | None = None) -> tuple[Node, bool]:
        """A node's worker for a rollout of ``image``, and whether the node held the image already."""
        assert self._changed is not None, "call start() first"
        async with self._changed:
            self.waiting += 1
            if image is not None:
                self.locality.wanting[image] += 1
            try:
                while True:
                    best = None
                    if self.running() < self.concurrency:
                        best = self.locality.choose(self.nodes.values(), image, avoid)
                    if best is None:
                        best = queue_on(self.nodes.values(), image, avoid)
                    if best is not None:
                        best.used += 1
                        self.peak = max(self.peak, self.running())
                        held = image is None or image in best.images
                        self.locality.sent(best, image)
                        if image is not None and any(n.free > 0 for n in self.nodes.values()):
                            self._changed.notify_all()  # a node it left to this rollout may now be someone's
                        return best, held
                    self._gauges()
                    await self._changed.wait()
            finally:
                self.waiting -= 1
                if image is not None:
                    self.locality.wanting[image] -= 1
                    if not self.locality.wanting[image]:
                        del self.locality.wanting[image]
                self._gauges()

    @property
    def ahead(self) -> int:
        """Rollouts the driver may send beyond the running ones: each worker holds up to one per slot, waiting
        there to start the moment a slot frees (``cluster.workers.mailbox``)."""
        return self.concurrency

    def peak_running(self) -> int | None:
        return self.peak

    def running(self) -> int:
        """Rollouts running now (a worker runs at most its slots; the rest of what it was sent waits there)."""
        return running(self.nodes.values())

    def _workers_of(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.node_id == node_id]

    async def _limit_changed(self, node_id: str, change: Change) -> None:
        """A node's limit changed: its workers are told their share at once (a lower one starts nothing more until
        fewer run; a higher one starts what waits there), and the rollouts waiting for a slot look again."""
        print(f"[farm] node {node_id[:8]}: limit {change.old} → {change.new} ({change.why})", file=self.out,
              flush=True)
        for worker in self._workers_of(node_id):
            if worker.channel is not None:
                worker.channel.resize(worker.slots)
        await self._notify()

    async def _release(self, node: Node) -> None:
        async with self._changed:
            node.used -= 1
            self._gauges()
            self._changed.notify_all()

    def note_queue(self, not_started: int) -> None:
        """The driver's count of rollouts not yet admitted to its window (part of the queue depth)."""
        self.not_started = not_started
        self._gauges()

    def _gauges(self) -> None:
        running = self.running()
        sent_ahead = sum(n.used for n in self.nodes.values() if n.alive) - running
        self.metrics.set("rollouts_in_flight", running)
        self.metrics.set("queue_depth", self.waiting + self.not_started + sent_ahead)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
