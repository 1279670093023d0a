"""Choosing and starting the backend a run's rollouts execute on (``farm.backend``), and what it is started with.

``start_backend`` is the one place a backend starts; ``FarmAssembly.open`` is its one caller."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TextIO

from cluster.backends.local import LocalBackend
from cluster.backends.seam import Backend, WorkerSource
from cluster.compose import Composer
from cluster.config.run_config import RunConfig
from cluster.placement.slots import RESERVED_CPUS, RESERVED_MEMORY, Resources, parse_memory
from cluster.transfer.setup import ImagesSection
from cluster.workers.in_process import InProcessBackend
from rollout.config.components import RunsContainers, TimesGrading
from rollout.errors import ConfigError
from rollout.records import Task

KEEP_IDLE_DEFAULT = 600.0
"""Seconds a worker kept after a run waits for the next (``farm.keep_workers_idle``'s default with ``serve.keep``)."""
WORKER_SECTIONS = ("model", "agent", "environment", "runtime", "verifier", "profiles", "serve", "images")
"""The run config's sections a worker composes from: part of a kept worker's key (``cluster.workers.kept``)."""

DEADLINE_MARGIN = 300.0
"""Seconds added to the agent's and the model's time limits and the grading timeout for the default host-side
deadline (the environment's reset, e.g. a container start, counts against neither limit)."""


@dataclass
class BackendSettings:
    """What a backend is started with, besides its source (a run's from its config: ``run_settings``; a trainer's
    from ``RolloutFarm``'s options)."""

    run_id: str
    concurrency: int
    """Rollouts in flight at once, over all nodes."""
    resources: Resources | None = None
    """What one rollout takes on a node (slots per node follow from it); None: nothing countable."""
    deadline: float | None = None
    """Host-side seconds per attempt; None: none."""
    run_dir: str | None = None
    engines: tuple[str, ...] = ()
    """The container engines the rollouts use (their leftovers are reaped per node)."""
    name: str = "rollout-worker"
    """The worker actors' name prefix (the dashboard shows it)."""
    worker: bool = False
    """``local``: one ``RolloutWorker`` in process (a trainer's pause gate and policy version) instead of plain
    asyncio tasks."""
    announce: bool = False
    """Print where the workers run and how many slots each node has."""
    images: ImagesSection | None = None
    """How images reach the nodes."""
    image_of: Callable[[Task], str | None] | None = None
    """A task's image name (image locality), when the rollouts run in containers."""
    keep: float = 0.0
    """``ray`` on a joined cluster: seconds the workers stay after the run for a later one (``cluster.workers.kept``);
    0: they end with it."""
    made_of: dict[str, Any] = field(default_factory=dict)
    """The config sections the workers compose from (``WORKER_SECTIONS``), part of a kept worker's key."""


def default_deadline(composer: Composer) -> float | None:
    """The agent's ``time_limit`` + its model budget (``model_time_limit``, by default the same) + the verifier's
    ``eval_timeout`` + a margin (max over profiles); None when an agent has no time limit (nothing bounds the
    attempt, so no deadline is guessed)."""
    worst = 0.0
    for profile in composer.profiles.values():
        limits = profile.limits
        if limits.time_limit is None or limits.model_budget is None:
            return None
        verifier = profile.verifier.config if profile.verifier is not None else None
        grading = verifier.eval_timeout if isinstance(verifier, TimesGrading) else 0.0
        worst = max(worst, limits.time_limit + limits.model_budget + (grading or 0.0))
    return worst + DEADLINE_MARGIN


def rollout_resources(config: RunConfig, composer: Composer) -> Resources:
    """What one rollout takes on a node: ``farm.cpus_per_rollout``/``memory_per_rollout``; without them, a rollout
    in a container reserves ``RESERVED_CPUS``/``RESERVED_MEMORY`` (or its container's limits, when smaller), and
    runtimes without containers nothing countable. With ``farm.adaptive`` each node's limit is found by measuring."""
    farm = config.farm
    cpus, memory, keys = farm.cpus_per_rollout, parse_memory(farm.memory_per_rollout), {}
    if cpus is not None:
        keys["cpus"] = f"farm.cpus_per_rollout={cpus:g}"
    if memory is not None:
        keys["memory"] = f"farm.memory_per_rollout={farm.memory_per_rollout}"
    limits = [profile.runtime.config for profile in composer.profiles.values() if profile.runtime is not None]
    for runtime in (limit for limit in limits if isinstance(limit, RunsContainers)):
        if farm.cpus_per_rollout is None:
            own = float(runtime.cpus) < RESERVED_CPUS
            found = float(runtime.cpus) if own else RESERVED_CPUS
            if found > (cpus or 0.0):
                cpus = found
                keys["cpus"] = f"runtime.cpus={found:g}" if own else f"farm.cpus_per_rollout={found:g} (its default)"
        if farm.memory_per_rollout is None:
            own = (parse_memory(runtime.memory) or 0) < parse_memory(RESERVED_MEMORY)
            found = parse_memory(runtime.memory) if own else parse_memory(RESERVED_MEMORY)
            if found > (memory or 0):
                memory = found
                keys["memory"] = (f"runtime.memory={runtime.memory}" if own
                                  else f"farm.memory_per_rollout={RESERVED_MEMORY} (its default)")
    return Resources(cpus=cpus, memory_bytes=memory, max_per_node=farm.max_per_node,
                     workers_per_node=farm.workers_per_node, node_resources=dict(farm.node_resources), keys=keys,
                     adaptive_window=farm.adaptive_window if farm.adaptive else None)


def ray_available() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install 'rollout-farm[ray]' (or set farm.backend=local)",
                          "farm.backend") from None


async def start_backend(kind: str | None, source: WorkerSource, settings: BackendSettings, *,
                        out: TextIO = sys.stderr) -> tuple[Backend, Callable[[], Awaitable[None]]]:
    """``(backend, how to close it)``: ``local``: rollouts as asyncio tasks in this process, over ``source``'s
    composer and one model (``settings.worker``: one ``RolloutWorker``, with the trainer's pause gate and policy
    version); ``ray``: a worker actor per node of the connected cluster."""
    if kind == "local" and settings.worker:
        backend = InProcessBackend(source)
        return backend, backend.close
    if kind == "local":
        local = LocalBackend(source.composer, source.build_model(), source.model_url)
        return local, local.close
    if kind != "ray":
        raise ConfigError(f"must be 'ray' or 'local', got {kind!r}", "farm.backend")
    from cluster.workers.kept import KeepWorkers  # imports ray, as below
    from cluster.workers.ray_backend import RayBackend  # imports ray: the local backend runs without it

    keep = KeepWorkers(settings.keep, settings.made_of) if settings.keep > 0 else None
    backend = RayBackend(source, run_id=settings.run_id, resources=settings.resources or Resources(),
                         concurrency=settings.concurrency, deadline=settings.deadline, run_dir=settings.run_dir,
                         engines=settings.engines, name=settings.name, images=settings.images,
                         image_of=settings.image_of, keep=keep, out=out)
    await backend.start()
    if settings.announce:
        limit = f"{settings.deadline:g}s" if settings.deadline else "none"
        print(f"farm: {backend.describe()}; deadline per attempt: {limit}", file=out, flush=True)
    return backend, backend.close


def run_settings(config: RunConfig, composer: Composer, *, run_id: str, run_dir: str | None) -> BackendSettings:
    """A run's (``rollout run``) backend settings, from its config."""
    farm = config.farm
    return BackendSettings(run_id=run_id, run_dir=run_dir, resources=rollout_resources(config, composer),
                           concurrency=config.run.concurrency, engines=tuple(sorted(composer.container_engines())),
                           deadline=farm.deadline if farm.deadline is not None else default_deadline(composer),
                           announce=True, images=config.images, image_of=composer.image_of,
                           keep=keep_workers_idle(config),
                           made_of=config.model_dump(mode="json", include=set(WORKER_SECTIONS)))


def keep_workers_idle(config: RunConfig) -> float:
    """Seconds a run's workers stay after it (``farm.keep_workers_idle``; by default ``KEEP_IDLE_DEFAULT`` with
    ``serve.keep``): 0 unless the run joins a cluster (the assembly checks again that it did not start one)."""
    farm = config.farm
    idle = farm.keep_workers_idle
    if idle is None:
        idle = KEEP_IDLE_DEFAULT if config.serve is not None and config.serve.keep else 0.0
    return idle if farm.joins_cluster else 0.0


def farm_settings(config: RunConfig, composer: Composer) -> dict[str, object]:
    """``RolloutFarm`` keyword options from a run config's ``farm`` and ``run`` sections."""
    return dict(
        backend=config.farm.backend, address=config.farm.address, num_cpus=config.farm.num_cpus,
        resources=rollout_resources(config, composer), concurrency=config.run.concurrency,
        max_attempts=config.run.max_attempts, seed=config.run.seed,
        deadline_per_attempt=config.farm.deadline or default_deadline(composer),
        engines=sorted(composer.container_engines()), name=config.run_id or "farm", images=config.images,
    )
