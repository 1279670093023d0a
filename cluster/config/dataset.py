"""A run config's ``dataset`` section as tasks, read one way for ``rollout run`` and for ``RolloutFarm.dataset``: the
path resolved beside the config file (regenerated first when it names a generator), a file of rows or a directory
of Harbor tasks loaded, ``ids`` / ``pattern`` / ``slice`` applied, and Harbor tasks checked against the run's
environment before any work (their networks), with the run's one warning about the ``task.toml`` keys not
honoured here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cluster.config.run_config import DatasetConfig, RunConfig
from envs.harbor.dataset import describe_unhonoured, load_harbor_tasks
from envs.harbor.env import check_tasks
from rollout.data.dataset import load_tasks, select
from rollout.errors import ConfigError
from rollout.records import Task
from rollout.registry import Registry


def dataset_file(dataset: DatasetConfig, config_path: str | Path | None) -> Path:
    """The dataset section's file or directory: relative to the config file (the current directory for a config
    given as a dict), (re)generated first when it names a generator."""
    path = Path(dataset.path).expanduser()
    if dataset.path.startswith("hf://"):
        return dataset.path  # a hub dataset: no file to resolve
    if not path.is_absolute():
        base = Path(config_path).resolve().parent if config_path is not None else Path.cwd()
        path = (base / path).resolve()
    if dataset.generate:
        generate = Registry("dataset generator", {}).load(dataset.generate, field="dataset.generate")
        path = Path(generate(path.parent))
    return path


def harbor_tasks(path: Path, environment: dict[str, Any] | None,
                 ids: list[str] | None = None) -> tuple[list[Task], str | None]:
    """A Harbor task directory's tasks (only ``ids`` when given), checked against the run's environment section
    before any work (their networks), and the run's one warning about the task.toml keys not honoured here."""
    tasks = load_harbor_tasks(path, ids=ids)
    if (environment or {}).get("type") != "harbor":
        raise ConfigError("a harbor dataset runs in environment.type harbor (with verifier.type harbor)",
                          "environment.type")
    check_tasks(tasks, environment)
    return tasks, describe_unhonoured(tasks)


def load_dataset(config: RunConfig, config_path: str | Path | None,
                 row_check: Callable[[Task], None] | None = None) -> tuple[Path, list[Task], list[str]]:
    """(the dataset's path, its selected tasks, notes to print once) for ``config``'s dataset section. ``row_check``:
    the environments' checks of a row (``Composer.row_check``), for a file of rows."""
    dataset = config.dataset
    path = dataset_file(dataset, config_path)
    notes: list[str] = []
    if dataset.type == "harbor":
        tasks, note = harbor_tasks(path, config.environment, dataset.ids)
        notes.extend([note] if note else [])
    else:
        tasks = load_tasks(path, row_check, allow_outside_paths=dataset.allow_outside_paths)
    return path, select(tasks, dataset.ids, dataset.pattern, dataset.slice), notes
