"""What a start-up measures and prepares beside Ray: the clock that splits the seconds before the first model
call, and the container images of the first rollouts resolved while the cluster starts.

A run hands ``resolve_images`` for its first rollouts (as many as run at once) to ``FarmAssembly.open`` to run
beside the join: found, or built from their rows, so the workers find them; the later rollouts' images stay the
workers' business.

``StartupClock`` keeps each part's span (wall clock, so a worker's first model call on the same host compares);
``split`` gives the run summary's ``startup`` entry: seconds from the job's start to the first model call, each
part's seconds, and which parts ran side by side.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Iterable, Iterator, TypeVar

from envs.images.image_names import image_for
from envs.images.instance_images import MAX_PARALLEL_BUILDS, ensure_instance_image
from rollout.config.components import BuildsImages, RunsContainers

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
    chosen: dict[str, tuple[Any, int | None]] = {}
    for task in tasks:
        profile = composer.profiles[task.data.get("profile")]
        env, runtime = profile.environment.config, profile.runtime.config if profile.runtime is not None else None
        if not (isinstance(env, BuildsImages) and env.build_images and isinstance(runtime, RunsContainers)):
            continue
        if runtime.container_engine != "docker":
            continue
        chosen.setdefault(image_for(task.data), (task, env.image_budget_bytes))
    return list(chosen.values())


def resolve_images(composer: Any, tasks: Iterable[Any]) -> int:
    """Find or build the images of ``image_tasks`` (as many at a time as a worker builds); a failure is left to
    the rollouts of that instance, which report it. Returns how many images were looked at."""
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
