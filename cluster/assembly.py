"""The composition root above the worker: one object owns joining or starting Ray, deploying the model tier,
starting the backend, and closing all three in reverse.

``rollout run`` (``cluster.run.job``), ``rollout serve``, ``rollout gym serve``, ``RolloutFarm`` and the RL example
each build a ``FarmAssembly``; none of them joins Ray or deploys the model tier itself. Its parts:

- ``session``: the Ray cluster (``cluster.session.connect.ClusterSession``: joined, or embedded and then owned —
  the one record of who stops it). Only opened when something needs Ray (a Serve app, the Ray backend).
- ``served``: the ``serve`` section deployed by its kind (``cluster.serving.kinds``), or None; or, for a
  ``fake_server`` section (the scripted app's in-process spelling), the scripted server on this process's event
  loop (``driver_server``), advertised on the node's address when the run joins a cluster.
- ``backend``: where rollouts execute (``cluster.backends.choose.start_backend``).

``close`` stops the backend and the model side by side; ``release`` then stops the cluster if this assembly
started it (a run does that while its outputs are written). A run's start-up, with its parts side by side, is
``cluster.run.startup``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Awaitable, Callable, TextIO

from cluster.serving.kinds import app_for
from rollout.errors import ConfigError


class FarmAssembly:
    def __init__(self, serve: Any = None, *, model: dict[str, Any] | None = None, address: str | None = None,
                 num_cpus: int | None = None, dashboard: bool = False, backend: str = "ray",
                 dataset: str | None = None, fake_server: Any = None, remote: bool = False,
                 out: TextIO = sys.stderr):
        from cluster.session.connect import ClusterSession

        self.serve, self.model, self.dataset, self.out = serve, dict(model or {}), dataset, out
        self.fake_server, self.remote = fake_server, remote
        self.driver_server: Any = None
        self._posted = False
        self.backend_kind = backend
        cpus = app_for(serve).cluster_cpus(serve, num_cpus) if serve is not None else num_cpus
        self.session = ClusterSession(address, num_cpus=cpus, dashboard=dashboard, out=out)
        self.served: Any = None
        self.backend: Any = None
        self._close_backend: Callable[[], Awaitable[None]] | None = None

    @classmethod
    def for_run(cls, config: Any, *, dataset: str | None = None, out: TextIO = sys.stderr) -> "FarmAssembly":
        """The assembly a run config (``cluster.run.config.RunConfig``, validated) describes."""
        from cluster.serving.scripted_server.for_runs import joins_cluster

        farm = config.farm
        return cls(config.serve, model=config.model, address=farm.address, num_cpus=farm.num_cpus,
                   dashboard=farm.dashboard, backend=farm.backend, dataset=dataset, fake_server=config.fake_server,
                   remote=joins_cluster(farm), out=out)

    @property
    def model_id(self) -> str:
        return self.serve.served_name(self.model) if self.serve is not None else self.model.get("model", "")

    @property
    def needs_ray(self) -> bool:
        """Ray is joined or started: for the Ray backend, or for a model kind that deploys on Serve."""
        return self.backend_kind == "ray" or (self.serve is not None and app_for(self.serve).deploys)

    @property
    def owns_cluster(self) -> bool:
        return self.session.owned

    def join(self) -> "FarmAssembly":
        """Join or start the cluster when something needs Ray (on the main thread: Ray wants it)."""
        if self.needs_ray:
            self.session.open()
        return self

    def start_model(self) -> Any:
        """Deploy the ``serve`` section (its kind builds it) and wait until it answers (blocking: call it on a
        thread from async code); None without one. A model that cannot start is a ``ConfigError`` in one line."""
        from cluster.serving import apps

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
        from rollout.data.dataset import load_tasks

        kind.post_tasks(self.serve, load_tasks(self.dataset, allow_outside_paths=True))
        self._posted = True
        return None

    async def start_in_driver(self) -> str | None:
        """The ``fake_server`` section's scripted policy served on this process's event loop (the scripted app
        played in process); its base URL, or None without that section."""
        if self.fake_server is None:
            return None
        from cluster.serving.scripted_server.for_runs import start_demo_server

        self.driver_server = await start_demo_server(self.fake_server, dataset=self.dataset, remote=self.remote)
        return self.driver_server.url

    async def start_models(self) -> str | None:
        """Whichever model this assembly serves (a trainer's farm: the in-process scripted server, or the
        ``serve`` section deployed on a thread); its base URL, or None when the model section names its own."""
        url = await self.start_in_driver()
        if self.serve is not None:
            url = (await asyncio.to_thread(self.start_model)).base_url
        return url

    async def post_tasks(self, tasks: list[Any]) -> None:
        """A trainer's call hands the farm ``tasks``: a scripted model, in process or on Serve, sees them."""
        if self.driver_server is not None:
            self.driver_server.model.tasks.update({task.task_id: task for task in tasks})
        if self.serve is not None:
            self._posted = True
            await asyncio.to_thread(app_for(self.serve).post_tasks, self.serve, tasks)

    def controls(self) -> Any:
        """The RL controls of the model this assembly serves (its kind's); a model it does not serve has none
        (``EndpointControls`` raise ``NotSupported``)."""
        from cluster.serving.controls import EndpointControls, ScriptedControls

        if self.served is not None:
            return self.served.controls()
        if self.serve is not None:
            raise RuntimeError("the farm's model is not deployed (start the farm first; a closed farm has none)")
        return ScriptedControls() if self.fake_server is not None else EndpointControls()

    async def start_backend(self, source: Any, **settings: Any) -> Any:
        """The backend ``backend_kind`` names over ``source`` (``cluster.backends.choose.start_backend``)."""
        from cluster.backends.choose import start_backend

        self.backend, self._close_backend = await start_backend(self.backend_kind, source, out=self.out,
                                                                **settings)
        return self.backend

    async def set_model_url(self, base_url: str) -> None:
        """The model answers at ``base_url`` now: the backend's workers, started and to come, use it."""
        setter = getattr(self.backend, "set_model_url", None)
        if setter is not None:
            await setter(base_url)

    async def close(self, wait: bool = True) -> None:
        """Stop the backend and the model side by side (``wait=False``: a run that ends tells Serve and goes on);
        the first error is raised once everything is down. Closing twice does nothing more."""
        stops = []
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

    async def release(self) -> bool:
        """Stop the cluster if this assembly started it, or disconnect from one it joined (on a thread: nothing of
        the run needs it any more)."""
        if not (self.session.owned or self.session.joined):
            return False
        return await asyncio.to_thread(self.session.release)

    def stop_model(self) -> None:
        """Delete the deployed model now, even one ``serve.keep`` would leave (``rollout serve`` interrupted)."""
        if self.served is not None:
            self.served.section = self.served.section.model_copy(update={"keep": False})
            self.served.stop()
            self.served = None
