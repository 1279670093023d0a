"""``FarmAssembly``: one object owns joining or starting Ray, serving the model, starting the backend, and closing
all three in reverse; ``open`` is the one way to start them (``open_model`` when nothing runs rollouts).

``rollout run``, ``rollout serve``, ``rollout gym serve``, ``RolloutFarm`` and the RL example each build one and
call ``open``/``open_model`` and ``close``/``release``; none of them joins Ray, deploys a model or starts a
backend itself. Its parts:

- ``session``: the Ray cluster (``ClusterSession``: joined, or embedded and then owned — the one record of who
  stops it). Only opened when something needs Ray (a Serve app, the Ray backend).
- ``served``: the ``serve`` section deployed by its kind (``cluster.serving.kinds``), or None; or, for a scripted
  policy played here (``played_here``: ``serve.in_process``, or any scripted app on the local backend), the
  scripted server on this process's event loop (``driver_server``), advertised on the node's address when the run
  joins a cluster.
- ``backend``: where rollouts execute (``backend_choice.start_backend``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Awaitable, Callable, Sequence, TextIO

from cluster.assembly.backend_choice import BackendSettings, start_backend
from cluster.assembly.ingress import delete_ingress, deploy_ingress
from cluster.assembly.startup import StartupClock
from cluster.backends.seam import Backend, WorkerSource
from cluster.config.run_config import RunConfig
from cluster.serving import apps
from cluster.serving.apps import ServedModel
from cluster.serving.config import ServeSection
from cluster.serving.controls import EndpointControls, ModelControls, ScriptedControls
from cluster.serving.kinds import app_for
from cluster.serving.replica_watch import ReplicaWatch
from cluster.serving.scripted_server.for_runs import start_demo_server
from cluster.session.connect import ClusterSession, join_address
from rollout.access import listening_line
from rollout.data.dataset import load_tasks
from rollout.errors import ConfigError
from rollout.records import Task


class FarmAssembly:
    def __init__(self, serve: ServeSection | None = None, *, model: dict | None = None, address: str | None = None,
                 num_cpus: int | None = None, dashboard: bool = False, backend: str | None = "ray",
                 dataset: str | None = None, played_here: ServeSection | None = None, remote: bool = False,
                 out: TextIO = sys.stderr):
        self.serve, self.model, self.dataset, self.out = serve, dict(model or {}), dataset, out
        self.played_here, self.remote = played_here, remote
        """A scripted ``serve`` section played on this process's event loop instead of deployed (or None)."""
        self.driver_server = None
        """The scripted server playing ``played_here``, once open."""
        self._posted = False
        self.backend_kind = backend
        cpus = app_for(serve).cluster_cpus(serve, num_cpus) if serve is not None else num_cpus
        self.session = ClusterSession(address, num_cpus=cpus, dashboard=dashboard, out=out)
        self.served: ServedModel | None = None
        self.replicas: ReplicaWatch | None = None
        """The run's model application watched for lost replicas while it runs (``open``'s path only)."""
        self.model_outages: dict | None = None
        """What ``replicas`` saw once the assembly closed: the model tier's outages, or None."""
        self.backend: Backend | None = None
        self._close_backend: Callable[[], Awaitable[None]] | None = None
        self._ingresses: list[str] = []

    @classmethod
    def for_run(cls, config: RunConfig, *, dataset: str | None = None, out: TextIO = sys.stderr) -> "FarmAssembly":
        """The assembly a run config describes."""
        farm = config.farm
        return cls(config.deployed, model=config.model, address=farm.address, num_cpus=farm.num_cpus,
                   dashboard=farm.dashboard, backend=farm.backend, dataset=dataset, played_here=config.played_here,
                   remote=farm.joins_cluster, out=out)

    @property
    def model_id(self) -> str:
        return self.serve.served_name(self.model) if self.serve is not None else self.model.get("model", "")

    @property
    def needs_ray(self) -> bool:
        """Ray is joined or started: for the Ray backend, or for a model kind that deploys on Serve."""
        return self.backend_kind == "ray" or (self.serve is not None and app_for(self.serve).deploys)

    @property
    def deploys(self) -> bool:
        """The model is an application this assembly deploys (not an endpoint someone else runs)."""
        return self.serve is not None and app_for(self.serve).deploys

    @property
    def reads_dataset(self) -> bool:
        """The model's kind reads the run's dataset (a scripted policy plays its tasks)."""
        return self.serve is not None and app_for(self.serve).reads_dataset

    @property
    def workers_here(self) -> bool:
        """The Ray backend's workers run on this machine (an embedded cluster, none joined), so what they need from
        this machine's image store can be prepared here while the cluster starts."""
        return self.backend_kind == "ray" and join_address(self.session.address) is None

    @property
    def owns_cluster(self) -> bool:
        return self.session.owned

    def join(self) -> "FarmAssembly":
        """Join or start the cluster when something needs Ray (on the main thread: Ray wants it). ``open`` and
        ``open_model`` do; a trainer's farm that runs ``open`` on a thread of its own joins here first."""
        if self.needs_ray:
            self.session.open()
        return self

    def open(self, source: WorkerSource, settings: BackendSettings, *, clock: StartupClock | None = None,
             beside: Sequence[Callable[[], object]] = ()) -> Awaitable[Backend]:
        """Start everything: joins (or starts) the cluster now, on this thread (Ray wants the main thread), while
        ``beside`` (host-side preparation: images, leftovers) runs on threads; the awaitable it returns then serves
        the model and starts the backend over ``source`` and returns the backend.

        On Ray the model deploys while the workers start, and they learn its URL once it answers; the local
        backend starts after the model (it builds its client from the URL). Whatever fails, what had started is
        closed, and that error is the one raised. ``clock`` times the parts (``ray``, ``serve``, ``workers``)."""
        clock = clock or StartupClock()
        pool = ThreadPoolExecutor(max(1, len(beside)), thread_name_prefix="startup") if beside else None
        background = [pool.submit(fn) for fn in beside] if pool is not None else []
        if pool is not None:
            pool.shutdown(wait=False)
        try:
            with clock.span("ray"):
                self.join()
        except BaseException:
            for work in background:
                work.exception()  # let the threads finish before the error leaves
            raise
        return self._start(source, settings, clock, background)

    async def _start(self, source: WorkerSource, settings: BackendSettings, clock: StartupClock,
                     background: list[Future]) -> Backend:
        waits = [asyncio.wrap_future(work) for work in background]
        try:
            url = await self._serve_in_driver()
            if url is not None:
                source.base_url = url
            if self.backend_kind == "ray":
                serving = asyncio.to_thread(clock.call, "serve", self._start_model) if self.serve else _none()
                starting = clock.timed("workers", self._start_backend(source, settings))
                backend, served, *rest = await asyncio.gather(starting, serving, *waits, return_exceptions=True)
                failed = [r for r in (served, backend, *rest) if isinstance(r, BaseException)]
                if failed:
                    raise failed[0]
                if served is not None:
                    await backend.set_model_url(served.base_url)
                    if app_for(self.serve).deploys:  # replicas on Serve: their outages go in the summary
                        self.replicas = ReplicaWatch(self.serve.name).start()
                return backend
            await asyncio.gather(*waits)
            served = await asyncio.to_thread(clock.call, "serve", self._start_model) if self.serve else None
            if served is not None:
                source.base_url = served.base_url
            return await self._start_backend(source, settings)
        except BaseException:
            await asyncio.gather(*waits, return_exceptions=True)
            await self._close_quietly()
            raise

    def open_model(self) -> ServedModel | None:
        """Only the model: join or start the cluster and deploy the ``serve`` section (blocking); None without
        one (``rollout serve``, the agent server's model, a trainer's engine)."""
        return self.join()._start_model()

    def _start_model(self) -> ServedModel | None:
        """Deploy the ``serve`` section (its kind builds it) and wait until it answers; None without one. A model
        that cannot start is a ``ConfigError`` in one line."""
        if self.serve is None:
            return None
        try:
            self.served = apps.start(self.serve, self.model_id, base_url=self.model.get("base_url"),
                                     dataset=self._carry_dataset(), remote=self.remote, out=self.out)
        except Exception as exc:  # noqa: BLE001 - a model that cannot start: say so in one line, run nothing
            last = str(exc).strip().splitlines()[-1][:500] if str(exc).strip() else ""
            raise ConfigError(f"the {self.serve.app} application did not start: {type(exc).__name__}: {last}",
                              "serve") from None
        return self.served

    def _carry_dataset(self) -> str | None:
        """The dataset path a deployed kind's replicas may read; one on Serve gets the dataset's tasks on the task
        board instead (its replicas may run on machines that have no such file), and no path."""
        kind = app_for(self.serve)
        if not (self.dataset and kind.reads_dataset and kind.deploys):
            return self.dataset
        kind.post_tasks(self.serve, load_tasks(self.dataset, allow_outside_paths=True))
        self._posted = True
        return None

    async def _serve_in_driver(self) -> str | None:
        """The scripted policy ``played_here`` served on this process's event loop; its base URL, or None."""
        if self.played_here is None:
            return None
        self.driver_server = await start_demo_server(self.played_here, dataset=self.dataset, remote=self.remote)
        print(listening_line(f"the scripted policy {self.played_here.policy!r}", self.driver_server.url,
                             self.driver_server.token, generated=self.played_here.api_key is None,
                             field="serve.api_key"), file=self.out, flush=True)
        return self.driver_server.url

    async def _start_backend(self, source: WorkerSource, settings: BackendSettings) -> Backend:
        if self.owns_cluster:  # workers kept on a cluster that stops with the run would serve nobody
            settings = dataclasses.replace(settings, keep=0.0)
        self.backend, self._close_backend = await start_backend(self.backend_kind, source, settings, out=self.out)
        return self.backend

    async def post_tasks(self, tasks: list[Task]) -> None:
        """A trainer's call hands the farm ``tasks``: a scripted model, in process or on Serve, sees them."""
        if self.driver_server is not None:
            self.driver_server.model.tasks.update({task.task_id: task for task in tasks})
        if self.serve is not None:
            self._posted = True
            await asyncio.to_thread(app_for(self.serve).post_tasks, self.serve, tasks)

    def controls(self) -> ModelControls:
        """The RL controls of the model this assembly serves (its kind's); a model it does not serve has none
        (``EndpointControls`` raise ``NotSupported``)."""
        if self.served is not None:
            return self.served.controls()
        if self.serve is not None:
            raise RuntimeError("the farm's model is not deployed (start the farm first; a closed farm has none)")
        return ScriptedControls() if self.played_here is not None else EndpointControls()

    async def close(self, wait: bool = True) -> None:
        """Stop the backend and the model side by side (``wait=False``: a run that ends tells Serve and goes on);
        the first error is raised once everything is down. Closing twice does nothing more."""
        stops = []
        if self.replicas is not None:  # before the application goes: its deletion is no outage
            await asyncio.to_thread(self.replicas.stop)
            self.model_outages, self.replicas = self.replicas.report(), None
        if self._close_backend is not None:
            stops.append(self._close_backend())
            self._close_backend = None
        if self.served is not None:
            stops.append(asyncio.to_thread(self.served.stop, wait))
            self.served = None
        if self.driver_server is not None:
            stops.append(self.driver_server.stop())
            self.driver_server = None
        if self._posted:
            self._posted = False
            stops.append(asyncio.to_thread(app_for(self.serve).clear_tasks, self.serve))
        closed = await asyncio.gather(*stops, return_exceptions=True)
        for error in (c for c in closed if isinstance(c, BaseException)):
            raise error

    async def _close_quietly(self) -> None:
        """Close what did start; the error that stopped the start-up is the one the caller sees."""
        try:
            await self.close()
        except Exception:  # noqa: BLE001
            pass

    async def release(self) -> bool:
        """Stop the cluster if this assembly started it, or disconnect from one it joined (on a thread: nothing of
        the run needs it any more)."""
        if not (self.session.owned or self.session.joined):
            return False
        return await asyncio.to_thread(self.session.release)

    def open_ingress(self, cls: type, init_arg: object, *, name: str, deployment: str, host: str, port: int | None,
                     asked: dict[str, object], route_prefix: str, max_ongoing_requests: int) -> str:
        """An HTTP application of ours on Serve beside the model (``ingress.deploy_ingress``), on the cluster this
        assembly joins; its URL. ``stop_ingress`` deletes it."""
        self.join()
        url = deploy_ingress(cls, init_arg, name=name, deployment=deployment, host=host, port=port, asked=asked,
                             route_prefix=route_prefix, max_ongoing_requests=max_ongoing_requests)
        self._ingresses.append(name)
        return url

    def stop_ingress(self) -> None:
        """Delete the applications ``open_ingress`` deployed."""
        while self._ingresses:
            delete_ingress(self._ingresses.pop())

    def weights_changed(self) -> None:
        """The served model's weights were reloaded: a later run with the same config must not take this
        application as its own (its fingerprint is forgotten)."""
        if self.serve is not None:
            apps.forget_fingerprint(self.serve)

    def stop_model(self) -> None:
        """Delete the deployed model now, even one ``serve.keep`` would leave (``rollout serve`` interrupted)."""
        if self.served is not None:
            self.served.section = self.served.section.model_copy(update={"keep": False})
            self.served.stop()
            self.served = None


async def _none() -> None:
    return None
