"""Choosing and starting the backend a run's rollouts execute on (``farm.backend``)."""

from __future__ import annotations

import sys
from typing import Any, Awaitable, Callable, TextIO

from cluster.compose import Composer
from cluster.run.config import RunConfig
from rollout.errors import ConfigError

DEADLINE_MARGIN = 300.0
"""Seconds added to the agent's and the model's time limits and the grading timeout for the default host-side
deadline (the environment's reset, e.g. a container start, counts against neither limit)."""


def default_deadline(composer: Composer) -> float | None:
    """The agent's ``time_limit`` + its model budget (``model_time_limit``, by default the same) + the verifier's
    ``eval_timeout`` + a margin (max over profiles); None when an agent has no time limit (nothing bounds the
    attempt, so no deadline is guessed)."""
    worst = 0.0
    for profile in composer.profiles.values():
        limits = profile.limits
        if limits.time_limit is None or limits.model_budget is None:
            return None
        grading = getattr(profile.verifier.config, "eval_timeout", 0.0) if profile.verifier is not None else 0.0
        worst = max(worst, limits.time_limit + limits.model_budget + (grading or 0.0))
    return worst + DEADLINE_MARGIN


def rollout_resources(config: RunConfig, composer: Composer) -> Any:
    """What one rollout takes on a node: ``farm.cpus_per_rollout``/``memory_per_rollout``, else the largest
    container runtime's ``cpus``/``memory`` (runtimes without containers take nothing countable)."""
    from cluster.workers.slots import Resources, parse_memory

    cpus = config.farm.cpus_per_rollout
    memory = parse_memory(config.farm.memory_per_rollout)
    for profile in composer.profiles.values():
        runtime = profile.runtime.config if profile.runtime is not None else None
        if runtime is None or not hasattr(runtime, "engine"):
            continue
        if config.farm.cpus_per_rollout is None:
            cpus = max(cpus or 0.0, float(runtime.cpus))
        if config.farm.memory_per_rollout is None:
            memory = max(memory or 0, parse_memory(runtime.memory) or 0) or None
    return Resources(cpus=cpus, memory_bytes=memory, max_per_node=config.farm.max_per_node,
                     workers_per_node=config.farm.workers_per_node)


def ray_available() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install 'rollout-farm[ray]' (or set farm.backend=local)",
                          "farm.backend") from None


async def start_ray_backend(source: Any, config: RunConfig, composer: Composer, *, run_id: str,
                            run_dir: str | None, out: TextIO = sys.stderr) -> Any:
    """Join or start the cluster and start one worker per node; prints where and how many slots."""

    from cluster.workers.ray_backend import RayBackend
    from cluster.session.connect import connect

    farm = config.farm
    connect(farm.address, num_cpus=farm.num_cpus, dashboard=farm.dashboard, out=out)  # main thread: Ray wants it
    deadline = farm.deadline if farm.deadline is not None else default_deadline(composer)
    backend = RayBackend(source, run_id=run_id, resources=rollout_resources(config, composer),
                         concurrency=config.run.concurrency, deadline=deadline, run_dir=run_dir,
                         engines=tuple(sorted(composer.container_engines())), out=out)
    await backend.start()
    limit = f"{deadline:g}s" if deadline else "none"
    print(f"farm: {backend.describe()}; deadline per attempt: {limit}", file=out, flush=True)
    return backend


def farm_settings(config: RunConfig, composer: Composer) -> dict[str, Any]:
    """``RolloutFarm`` keyword options from a run config's ``farm`` and ``run`` sections."""
    return dict(
        backend=config.farm.backend, address=config.farm.address, num_cpus=config.farm.num_cpus,
        resources=rollout_resources(config, composer), concurrency=config.run.concurrency,
        max_attempts=config.run.max_attempts, seed=config.run.seed,
        deadline_per_attempt=config.farm.deadline or default_deadline(composer),
        engines=sorted(composer.container_engines()), name=config.run_id or "farm",
    )


async def open_backend(job: Any, base_url: str | None) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """A run job's (``cluster.run.job.Job``) backend, the one ``farm.backend`` names, started, and how to close it."""
    if job.config.farm.backend == "local":
        model = job.composer.build_model(base_url)

        async def close_local() -> None:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

        from cluster.backends.local import LocalBackend

        return LocalBackend(job.composer, model), close_local
    from cluster.workers.worker import ConfigSource

    backend = await start_ray_backend(ConfigSource(job.composer, base_url), job.config, job.composer, run_id=job.run_id,
                                      run_dir=str(job.run_dir), out=job.out)
    return backend, backend.close
