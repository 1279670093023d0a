"""What a trainer call hands the farm, made ready: the config's own dataset read as ``rollout run`` reads it,
dataset-shaped rows as tasks (the one conversion a dataset file uses), the call's sampling on every task, and stale
members found after the call (``max_staleness``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, TextIO

from cluster.backends.sources import ConfigSource
from cluster.config.dataset import load_dataset
from cluster.farm.batch import NO_DATASET
from rollout.data.dataset import task_from_row
from rollout.errors import ConfigError
from rollout.records import RolloutResult, Task
from rollout.train.batch import staleness

SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "max_tokens", "min_tokens", "stop", "seed",
                           "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
                           "top_logprobs", "min_p"})


def dataset_tasks(source: Any, config_file: str | Path | None, out: TextIO) -> list[Task]:
    """The tasks of a farm's ``dataset`` section (a file of rows, or a directory of Harbor tasks, relative to the first
    config file; a dict config's relative to the current directory), selected and checked as ``rollout run`` does;
    its notes (the Harbor keys not honoured here) printed to ``out``."""
    if not isinstance(source, ConfigSource) or source.composer.config.dataset.path == NO_DATASET:
        raise ConfigError("this farm's config has no dataset section: hand generate() its tasks, or add one",
                          "dataset")
    composer = source.composer
    _, tasks, notes = load_dataset(composer.config, config_file, composer.row_check())
    for note in notes:
        print(note, file=out, flush=True)
    return tasks


def prepare_tasks(tasks: Iterable[Task | Mapping[str, Any]], sampling: Mapping[str, Any] | None) -> list[Task]:
    """Tasks (``Task``s, or rows as a dataset file has them) with ``sampling`` over each task's own."""
    out = []
    for i, item in enumerate(tasks):
        task = item if isinstance(item, Task) else task_from_row(dict(item), f"tasks[{i}]")
        if sampling:
            task = task.model_copy(update={"data": {**task.data,
                                                    "sampling": {**task.data.get("sampling", {}), **sampling}}})
        out.append(task)
    ids = [t.task_id for t in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"tasks: task id {dup!r} appears more than once (one group per task)")
    return out


def check_sampling(sampling: Mapping[str, Any] | None) -> None:
    """Unknown sampling keys fail before any work, naming them (a typo would otherwise be sent to the engine)."""
    unknown = sorted(set(sampling or {}) - SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"sampling: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(SAMPLING_KEYS))}")


def stale_members(results: Iterable[RolloutResult], current: Any, max_staleness: float | None) -> list[RolloutResult]:
    """Completed members whose oldest turn is more than ``max_staleness`` versions behind ``current``."""
    if max_staleness is None or current is None:
        return []
    return [r for r in results if r.status == "completed" and staleness(r, current) > max_staleness]
