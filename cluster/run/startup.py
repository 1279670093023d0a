"""A run's start-up, its parts side by side on the Ray backend, and the clock that splits the seconds before the
first model call.

``open_run``: on the Ray backend, Ray starts on the main thread (Ray wants it) while, on threads, the container
images of the first rollouts (as many as run at once) are resolved (found, or built from their rows, so the
workers find them; the later rollouts' images stay the workers' business) and containers a dead earlier attempt
left are reaped; then the run's Serve application deploys on a thread while the worker actors start, and the
workers learn the model's URL once it answers. Whatever fails, what had started is closed. The parts themselves
(the cluster session, the model, the backend) are the run's ``cluster.assembly.FarmAssembly``.

``StartupClock`` keeps each part's span (wall clock, so a worker's first model call on the same host compares);
``split`` gives the run summary's ``startup`` entry: seconds from the job's start to the first model call, each
part's seconds, and which parts ran side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
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


async def open_run(job: Any, assembly: Any, base_url: str | None) -> Any:
    """The job's backend started on ``assembly`` (``cluster.assembly``) and its ``serve`` model deployed; returns
    the backend. On Ray the model deploys while the workers start; the local backend starts after it. Whatever
    fails, what had started is closed."""
    from cluster.backends.choose import run_settings
    from cluster.run.host_checks import reap_leftovers
    from cluster.workers.worker import ConfigSource

    settings = run_settings(job.config, job.composer, run_id=job.run_id, run_dir=str(job.run_dir))
    if job.config.farm.backend == "ray":
        return await _open_on_ray(job, assembly, base_url, settings)
    reap_leftovers(job.run_id, job.composer.container_engines(), job.out)
    try:
        if assembly.serve is not None:
            assembly.join()  # a model on Serve under a local backend
            with job.clock.span("serve"):
                base_url = assembly.start_model().base_url
        return await assembly.start_backend(ConfigSource(job.composer, base_url), **settings)
    except BaseException:
        await _close_quietly(assembly)
        raise


async def _open_on_ray(job: Any, assembly: Any, base_url: str | None, settings: dict[str, Any]) -> Any:
    """Ray joined or started on the main thread while, on threads, the first rollouts' images are resolved and
    leftovers reaped; then the model deploys on a thread while the workers start, and they learn its URL."""
    from cluster.run.host_checks import reap_leftovers
    from cluster.session.connect import join_address
    from cluster.workers.worker import ConfigSource

    loop, clock = asyncio.get_running_loop(), job.clock
    background = [loop.run_in_executor(None, reap_leftovers, job.run_id, job.composer.container_engines(), job.out)]
    if join_address(job.config.farm.address) is None:  # the workers run here: their first rollouts' images, now
        first = [task for task, _, _ in job.plan.todo[:job.config.run.concurrency]]
        background.append(loop.run_in_executor(None, clock.call, "images", resolve_images, job.composer, first))
    try:
        with clock.span("ray"):
            assembly.join()
    except BaseException:
        await asyncio.gather(*background, return_exceptions=True)
        raise
    serving = loop.run_in_executor(None, clock.call, "serve", assembly.start_model) \
        if assembly.serve is not None else _none()
    starting = clock.timed("workers", assembly.start_backend(ConfigSource(job.composer, base_url), **settings))
    backend, served, *rest = await asyncio.gather(starting, serving, *background, return_exceptions=True)
    try:
        failed = [r for r in (served, backend, *rest) if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        if served is not None:
            await assembly.set_model_url(served.base_url)
    except BaseException:
        await _close_quietly(assembly)
        raise
    return backend


async def _close_quietly(assembly: Any) -> None:
    """Close what did start; the error that stopped the start-up is the one the caller sees."""
    try:
        await assembly.close()
    except Exception:  # noqa: BLE001
        pass


async def _none() -> None:
    return None
