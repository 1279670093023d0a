"""A run's start-up on the Ray backend, its parts side by side, and the clock that splits the seconds before the
first model call.

``start_ray_farm``: Ray starts on the main thread (Ray wants it) while, on threads, the container images of the
first rollouts (as many as run at once) are resolved (found, or built from their rows, so the workers find them;
the later rollouts' images stay the workers' business) and containers a dead earlier attempt left are reaped;
then the run's Serve application deploys on a thread while the worker actors start, and the workers learn the
model's URL once it answers. Whatever fails, what had started is closed. At the run's end
``release_own_cluster`` stops the embedded cluster the run started, while its outputs are written.

``StartupClock`` keeps each part's span (wall clock, so a worker's first model call on the same host compares);
``split`` gives the run summary's ``startup`` entry: seconds from the job's start to the first model call, each
part's seconds, and which parts ran side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

FIRST_CALL = "first container"
"""The part from the first rollout's dispatch to its first model call (image check, container start, reset)."""


class StartupClock:
    def __init__(self, t0: float | None = None):
        self.t0 = time.time() if t0 is None else t0
        self.spans: dict[str, tuple[float, float | None]] = {}

    def begin(self, name: str) -> None:
        self.spans[name] = (time.time(), None)

    def end(self, name: str, at: float | None = None) -> None:
        if name in self.spans:
            self.spans[name] = (self.spans[name][0], time.time() if at is None else at)

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` timed as ``name`` (for a thread)."""
        with self.span(name):
            return fn(*args)

    async def timed(self, name: str, awaitable: Awaitable[T]) -> T:
        with self.span(name):
            return await awaitable

    def split(self, first_call: float | None) -> dict[str, Any] | None:
        """``{"seconds", "parts": {name: seconds} in start order, "side_by_side": [names]}``; None before any
        model call (a run that did nothing, or whose rollouts never reached their model)."""
        if first_call is None:
            return None
        self.end(FIRST_CALL, first_call)
        done = sorted(((name, start, end) for name, (start, end) in self.spans.items() if end is not None),
                      key=lambda item: item[1])
        together = {a for a, a0, a1 in done for b, b0, b1 in done if a != b and a0 < b1 - 0.05 and b0 < a1 - 0.05}
        return {"seconds": round(first_call - self.t0, 2),
                "parts": {name: round(end - start, 2) for name, start, end in done},
                "side_by_side": [name for name, _, _ in done if name in together]}


def first_model_call(results: Iterable[Any]) -> float | None:
    """When the earliest first model call of ``results`` started (wall clock), or None."""
    starts = [r.trajectory.steps[0].started_at for r in results if r.trajectory.steps]
    return min((s for s in starts if s), default=None)


def image_tasks(composer: Any, tasks: Iterable[Any]) -> list[tuple[Any, int | None]]:
    """One ``(task, image budget)`` per image the tasks' environments build themselves (``build_images``) for a
    docker runtime: what each worker would otherwise find or build at its first rollout of the instance."""
    from envs.images.image_names import image_for

    chosen: dict[str, tuple[Any, int | None]] = {}
    for task in tasks:
        profile = composer.profiles[task.data.get("profile")]
        env, runtime = profile.environment.config, profile.runtime
        if runtime is None or not getattr(env, "build_images", False) or not hasattr(runtime.config, "image"):
            continue
        if (getattr(runtime.config, "engine", None) or runtime.config.type) != "docker":
            continue
        chosen.setdefault(image_for(task.data), (task, getattr(env, "image_budget_bytes", None)))
    return list(chosen.values())


def resolve_images(composer: Any, tasks: Iterable[Any]) -> int:
    """Find or build the images of ``image_tasks`` (as many at a time as a worker builds); a failure is left to
    the rollouts of that instance, which report it. Returns how many images were looked at."""
    from envs.images.instance_images import MAX_PARALLEL_BUILDS, ensure_instance_image

    todo = image_tasks(composer, tasks)

    def one(item: tuple[Any, int | None]) -> None:
        try:
            ensure_instance_image(item[0], budget_bytes=item[1])
        except Exception:  # noqa: BLE001 - the worker tries again and records the error on the rollout
            pass

    if todo:
        with ThreadPoolExecutor(MAX_PARALLEL_BUILDS, thread_name_prefix="images") as pool:
            list(pool.map(one, todo))
    return len(todo)


async def start_ray_farm(job: Any, base_url: str | None,
                         start_model: Callable[[], Any] | None) -> tuple[Any, Any]:
    """The job's Ray backend started and, with ``start_model`` (blocking: deploys and waits), its served model,
    side by side; images resolved and leftovers reaped meanwhile. Returns ``(backend, served or None)``."""
    import ray

    from cluster.backends.choose import start_ray_backend
    from cluster.run.host_checks import reap_leftovers
    from cluster.serving import apps
    from cluster.session.connect import connect
    from cluster.workers.worker import ConfigSource

    loop, clock, farm, section = asyncio.get_running_loop(), job.clock, job.config.farm, job.config.serve
    on_this_host = not (farm.address or os.environ.get("RAY_ADDRESS"))
    background = [loop.run_in_executor(None, reap_leftovers, job.run_id, job.composer.container_engines(), job.out)]
    if on_this_host:  # the workers run here: the images their first rollouts need, found (or built) now
        first = [task for task, _, _ in job.plan.todo[:job.config.run.concurrency]]
        background.append(loop.run_in_executor(None, clock.call, "images", resolve_images, job.composer, first))
    cpus = apps.cluster_cpus(section, farm.num_cpus) if section is not None else farm.num_cpus
    fresh = on_this_host and not ray.is_initialized()
    try:
        with clock.span("ray"):
            connect(farm.address, num_cpus=cpus, dashboard=farm.dashboard, out=job.out)
        job.owns_cluster = fresh
    except BaseException:
        await asyncio.gather(*background, return_exceptions=True)
        raise
    serving = loop.run_in_executor(None, clock.call, "serve", start_model) if start_model is not None else None
    starting = clock.timed("workers", start_ray_backend(
        ConfigSource(job.composer, base_url), job.config, job.composer, run_id=job.run_id,
        run_dir=str(job.run_dir), out=job.out))
    backend, served, *rest = await asyncio.gather(
        starting, serving if serving is not None else _none(), *background, return_exceptions=True)
    failed = [r for r in (served, backend, *rest) if isinstance(r, BaseException)]
    try:
        if failed:
            raise failed[0]
        if served is not None:
            await tell_model_url(backend, served.base_url)
    except BaseException:  # close what did start
        await asyncio.gather(*([] if isinstance(backend, BaseException) else [backend.close()]),
                             *([] if isinstance(served, BaseException) or served is None
                               else [asyncio.to_thread(served.stop)]), return_exceptions=True)
        raise
    return backend, served


async def tell_model_url(backend: Any, base_url: str) -> None:
    """The model answers at ``base_url`` now (it deployed while the workers started): workers the backend starts
    from now on get it with their source, the live ones (the starting ones once up) are told."""
    import ray

    backend.source.base_url = base_url
    backend.source_ref = ray.put(backend.source)
    await asyncio.gather(*(n.starting for n in backend.nodes.values() if n.starting is not None),
                         return_exceptions=True)
    await backend.broadcast("set_base_url", base_url)


async def release_own_cluster(job: Any) -> bool:
    """The embedded cluster ``start_ray_farm`` started for ``job``, stopped on a thread (nothing of the run needs
    it once its rollouts are done and its workers and model closed), rather than at the interpreter's exit; a
    cluster the job joined, or found running in its process, is left alone."""
    if not getattr(job, "owns_cluster", False):
        return False
    from cluster.session.connect import stop_embedded

    job.owns_cluster = False
    await asyncio.to_thread(stop_embedded)
    return True


async def _none() -> None:
    return None
