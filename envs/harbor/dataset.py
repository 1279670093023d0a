"""Harbor task directories as a dataset (``dataset: {type: harbor, path: DIR}``): a directory of tasks, or one task.

Each task becomes a ``Task``: its id the directory's name, its prompt ``instruction.md`` (the only text the agent
gets; a multi-step task's first step's), and in ``data["harbor"]`` what the farm needs to run it anywhere — the
parsed ``task.toml`` as text plus the variables its templates used, the image to run, the steps. Its files travel
as one archive (``task_archive``, ``envs.harbor.archive``), never as paths read on a node. Every problem is a
``ConfigError`` naming the task's directory and the field, raised before any work starts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from envs.harbor.archive import pack
from envs.harbor.images import environment_plan
from envs.harbor.task_config import TaskConfig, TaskConfigError, parse_task_toml
from rollout.data.paths import id_problem
from rollout.errors import ConfigError
from rollout.records import Task

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def task_dirs(root: str | Path) -> list[Path]:
    """``root`` itself when it is a task, else its task subdirectories, by name."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory of Harbor tasks", "dataset.path")
    if is_task_dir(root):
        return [root]
    found = sorted(p for p in root.iterdir() if p.is_dir() and is_task_dir(p))
    if not found:
        raise ConfigError(f"{root} holds no Harbor task (a directory with a task.toml)", "dataset.path")
    return found


def load_harbor_tasks(root: str | Path, environ: dict[str, str] | None = None,
                      ids: list[str] | None = None) -> list[Task]:
    """The tasks under ``root`` (only those named in ``ids`` when given: the others are not even read)."""
    return [load_task(path, environ) for path in task_dirs(root) if ids is None or path.name in ids]


def load_task(path: Path, environ: dict[str, str] | None = None) -> Task:
    environ = dict(os.environ) if environ is None else environ
    where = str(path)
    problem = id_problem(path.name)
    if problem:
        raise ConfigError(f"task directory name {path.name!r}: {problem}", where)
    text = _read(path / "task.toml", where, empty_ok=True)  # every field has a default
    try:
        config = parse_task_toml(text, environ)
    except TaskConfigError as exc:
        raise ConfigError(f"task.toml: {exc}", where) from None
    steps = [s.name for s in config.steps]
    instruction = _instruction(path, steps, where)
    _check_tests(path, steps, where)
    try:
        plan = environment_plan(path, config)
    except ValueError as exc:
        raise ConfigError(f"environment: {exc}", where) from None
    try:
        archive, digest = pack(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot pack the task directory: {exc}", where) from None
    used = {name: environ[name] for name in _VAR.findall(text) if name in environ}
    data: dict[str, Any] = {
        "task_archive": str(archive),
        "harbor": {"toml": text, "vars": used, "digest": digest, "image": plan.image, "build": plan.build,
                   "dockerfile": plan.dockerfile, "context": plan.context, "steps": steps,
                   "unknown": config.unknown, "ignored": config.ignored, "network_mode_set": config.network_mode_set},
    }
    metadata = {"harbor_name": config.name} if config.name else {}
    if config.metadata:
        metadata["harbor_metadata"] = config.metadata
    return Task(task_id=path.name, prompt=instruction, data=data, metadata=metadata)


def config_of(task: Task) -> TaskConfig:
    """The task's ``task.toml``, parsed again where the task runs, with the variables the dataset resolved."""
    harbor = task.data["harbor"]
    return parse_task_toml(harbor["toml"], dict(harbor.get("vars") or {}))


def _instruction(path: Path, steps: list[str], where: str) -> str:
    if steps:
        for name in steps:
            if not (path / "steps" / name / "instruction.md").is_file():
                raise ConfigError(f"step {name!r} has no steps/{name}/instruction.md", where)
        return _read(path / "steps" / steps[0] / "instruction.md", where)
    return _read(path / "instruction.md", where)


def _check_tests(path: Path, steps: list[str], where: str) -> None:
    shared = (path / "tests" / "test.sh").is_file()
    for name in steps:
        if not shared and not (path / "steps" / name / "tests" / "test.sh").is_file():
            raise ConfigError(f"step {name!r} has no tests/test.sh (neither its own nor the task's)", where)
    if not steps and not shared:
        raise ConfigError("no tests/test.sh: the verifier has nothing to run", where)


def _read(file: Path, where: str, empty_ok: bool = False) -> str:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{file.name} is missing", where) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {file.name}: {exc}", where) from None
    if not text.strip() and not empty_ok:
        raise ConfigError(f"{file.name} is empty", where)
    return text


def describe_unhonoured(tasks: list[Task]) -> str | None:
    """One warning for a run: the task.toml keys no task gets (unknown, or known and not honoured here)."""
    unknown: dict[str, int] = {}
    ignored: dict[str, int] = {}
    defaulted = 0
    for task in tasks:
        harbor = task.data.get("harbor") or {}
        for key in harbor.get("unknown") or ():
            unknown[key] = unknown.get(key, 0) + 1
        for key in harbor.get("ignored") or ():
            ignored[key] = ignored.get(key, 0) + 1
        defaulted += not harbor.get("network_mode_set", True)
    parts = []
    if ignored:
        parts.append("not honoured here: " + "; ".join(f"{k} in {n} task(s)" for k, n in sorted(ignored.items())))
    if unknown:
        parts.append("unknown keys kept but unused: " + ", ".join(f"{k} ({n})" for k, n in sorted(unknown.items())))
    if defaulted:
        parts.append(f"{defaulted} task(s) name no network_mode: they run with no network here (Harbor's default "
                     "is public)")
    return ("harbor tasks: " + " | ".join(parts)) if parts else None
