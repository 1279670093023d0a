"""Choosing and starting the backend a run's rollouts execute on (``farm.backend``)."""

from __future__ import annotations

import sys
from typing import Any, Awaitable, Callable, Sequence, TextIO

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
    from cluster.placement.slots import Resources, parse_memory

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
                     workers_per_node=config.farm.workers_per_node, node_resources=dict(config.farm.node_resources))


def ray_available() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install 'rollout-farm[ray]' (or set farm.backend=local)",
                          "farm.backend") from None


async def start_backend(kind: str | None, source: Any, *, run_id: str, concurrency: int, resources: Any = None,
                        deadline: float | None = None, run_dir: str | None = None, engines: Sequence[str] = (),
                        name: str = "rollout-worker", worker: bool = False, announce: bool = False,
                        images: Any = None, image_of: Any = None,
                        out: TextIO = sys.stderr) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The one place a backend starts (``cluster.assembly`` calls it): ``(backend, how to close it)``.

    ``local``: rollouts as asyncio tasks in this process, over ``source``'s composer and one model
    (``worker=True``: one ``RolloutWorker``, with the trainer's pause gate and policy version); ``ray``: a worker
    actor per node of the connected cluster (``announce``: print where and how many slots)."""
    if kind == "local" and worker:
        from cluster.backends.local import InProcessBackend

        backend = InProcessBackend(source)
        return backend, backend.close
    if kind == "local":
        from cluster.backends.local import LocalBackend

        model = source.build_model()

        async def close_local() -> None:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

        return LocalBackend(source.composer, model, source.model_url), close_local
    if kind != "ray":
        raise ConfigError(f"must be 'ray' or 'local', got {kind!r}", "farm.backend")
    from cluster.placement.slots import Resources
    from cluster.workers.ray_backend import RayBackend

    backend = RayBackend(source, run_id=run_id, resources=resources or Resources(), concurrency=concurrency,
                         deadline=deadline, run_dir=run_dir, engines=tuple(engines), name=name, images=images,
                         image_of=image_of, out=out)
    await backend.start()
    if announce:
        limit = f"{deadline:g}s" if deadline else "none"
        print(f"farm: {backend.describe()}; deadline per attempt: {limit}", file=out, flush=True)
    return backend, backend.close


def run_settings(config: RunConfig, composer: Composer, *, run_id: str, run_dir: str | None) -> dict[str, Any]:
    """``start_backend``'s settings for a run (``rollout run``) from its config."""
    farm = config.farm
    return dict(run_id=run_id, run_dir=run_dir, resources=rollout_resources(config, composer),
                concurrency=config.run.concurrency, engines=sorted(composer.container_engines()),
                deadline=farm.deadline if farm.deadline is not None else default_deadline(composer), announce=True,
                images=config.images, image_of=composer.image_of)


def farm_settings(config: RunConfig, composer: Composer) -> dict[str, Any]:
    """``RolloutFarm`` keyword options from a run config's ``farm`` and ``run`` sections."""
    return dict(
        backend=config.farm.backend, address=config.farm.address, num_cpus=config.farm.num_cpus,
        resources=rollout_resources(config, composer), concurrency=config.run.concurrency,
        max_attempts=config.run.max_attempts, seed=config.run.seed,
        deadline_per_attempt=config.farm.deadline or default_deadline(composer),
        engines=sorted(composer.container_engines()), name=config.run_id or "farm", images=config.images,
    )
