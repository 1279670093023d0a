"""What ``RolloutFarm`` runs on: its parts from a run config, and one batch of a trainer call ((task, sample)
members through the driver, results kept in memory, what a passed deadline cut short returned as failed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TextIO

from cluster.assembly.backend_choice import farm_settings
from cluster.backends.sources import ConfigSource
from cluster.compose import Composer
from cluster.config.run_config import RunConfig
from cluster.run.driver import Driver, rollout_meta
from cluster.run.host_checks import resolve_auto_runtimes
from rollout.config.load import load_config, validate
from rollout.errors import DeadlineExceeded
from rollout.records import RolloutResult, Task
from rollout.runner import failure_result
from rollout.store.resume import Plan, Planned
from rollout.waits import within

NO_DATASET = "-"
"""The dataset path of a farm's config that has no ``dataset`` section (the trainer hands the tasks to each call)."""


def from_run_config(config: str | Path | dict | list, overrides: Sequence[str] = ()) -> tuple[Any, dict]:
    """(the workers' source, the farm's settings: its ``serve`` section, deployed or played here, model, and the file
    a ``dataset`` section is read beside) from a run config (files merged in order, or a dict; ``dataset`` is not
    needed), validated once."""
    if isinstance(config, dict):
        raw, config_file = dict(config), None
    else:
        paths = [str(config)] if isinstance(config, (str, Path)) else [str(p) for p in config]
        raw, config_file = load_config(paths, list(overrides)), paths[0]
    raw.setdefault("dataset", {"path": NO_DATASET})
    resolve_auto_runtimes(raw)
    run_config = validate(RunConfig, raw)
    composer = Composer(run_config)
    source = ConfigSource(composer)
    return source, {**farm_settings(run_config, composer), "serve": run_config.deployed, "model": run_config.model,
                    "played_here": run_config.played_here, "remote": run_config.farm.joins_cluster,
                    "config_file": config_file}


class MemoryStore:
    """The driver's store for trainer calls: results stay in memory (the caller gets them)."""

    run_dir = None

    def append(self, result: RolloutResult, trajectory: bool = True) -> RolloutResult:
        return result


class MemberBatch:
    def __init__(self, backend: Any, *, concurrency: int, max_attempts: int, out: TextIO,
                 budget_spent: Callable[[], bool] | None):
        self.backend, self.concurrency, self.max_attempts = backend, concurrency, max_attempts
        self.out, self.budget_spent = out, budget_spent

    async def run(self, tasks: list[Task], samples: list[int], run_id: str, base_seed: int, deadline: float | None,
                  count: Callable[[RolloutResult], Awaitable[None]], first_attempt: int = 1,
                  history: list | None = None) -> tuple[list[RolloutResult], list[tuple[str, int]]]:
        """(every member's result, the members a token budget left unstarted)."""
        plan = Plan(first_attempt - 1 + self.max_attempts,
                    todo=[Planned(t, s, first_attempt) for t in tasks for s in samples])
        if history:
            plan.history = {(t.task_id, s): list(history) for t in tasks for s in samples}
        driver = Driver(self.backend, MemoryStore(), plan, run_id=run_id, concurrency=self.concurrency,
                        base_seed=base_seed, progress_interval=None, write_trajectories=False, out=self.out,
                        on_result=count, stop_when=self.budget_spent)
        try:
            await within(driver.run(), deadline)  # a trainer's cancel is never lost (rollout.waits)
        except asyncio.TimeoutError:
            pass
        finished = {(r.task_id, r.sample_index) for r in driver.finished}
        results = list(driver.finished)
        never = {(t.task_id, s) for t, s, _ in driver.not_started}
        for p in plan.todo:
            key = (p.task.task_id, p.sample_index)
            if key in finished or key in never:
                continue
            meta = rollout_meta(run_id, p.task, p.sample_index, p.attempt, base_seed)
            cut = failure_result(p.task, meta, DeadlineExceeded(f"the batch deadline of {deadline:g}s passed"))
            results.append(cut)
            await count(cut)
        return results, sorted(never)
