"""Datasets: tasks read from JSONL or a JSON list, selected by id, regex or slice, and hashed.

A row is either already in ``Task`` shape (``task_id``, ``prompt``, ``messages``, ``data``,
``metadata``) or a flat row (SWE-bench instances, QA sets): its id comes from ``task_id`` /
``instance_id`` / ``id`` and its prompt from ``prompt`` / ``problem_statement`` / ``question``
(first present wins). In a flat row every field except ``task_id``, ``prompt``, ``messages``
and ``metadata`` goes into ``data`` — so SWE rows keep ``instance_id`` and
``problem_statement`` there, where environments and verifiers look for them.

Every problem is a ``ConfigError`` naming the file, the 1-based line and the field, raised before any
work starts. Rows are input nobody vetted: task ids must be safe file names (``rollout.data.paths``), and a
``repo_path`` must stay inside the dataset's directory unless the caller allows outside paths.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from pydantic import ValidationError

from rollout.data.paths import id_problem
from rollout.data.rows import HF_PREFIX, fail as _fail, hf_rows, json_list_rows, jsonl_rows, type_name, utf8_text
from rollout.errors import ConfigError
from rollout.records import Task

ID_KEYS = ("task_id", "instance_id", "id")
PROMPT_KEYS = ("prompt", "problem_statement", "question")
TASK_FIELDS = frozenset(Task.model_fields)
# In a flat row these name Task fields of their own; everything else is environment data.
OWN_FIELDS = ("task_id", "prompt", "messages", "metadata")


def load_tasks(path: str | Path, row_check: Callable[[Task], None] | None = None, *,
               allow_outside_paths: bool = False) -> list[Task]:
    """Tasks from a ``.json`` file holding a list, or from JSONL (one object per line, blanks skipped).

    ``row_check(task)`` may raise ValueError/TypeError naming a field; the error gets the line number.
    ``allow_outside_paths``: a ``repo_path`` may be absolute or lead out of the dataset's directory (refused
    otherwise: a dataset from elsewhere must not make the farm read, copy or build from any host path).
    """
    if str(path).startswith(HF_PREFIX):
        rows, path = hf_rows(str(path)), Path(str(path))
    else:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read dataset: {exc.strerror or exc}", str(path)) from None
        text = utf8_text(data, path)
        rows = json_list_rows(text, path) if path.suffix == ".json" else jsonl_rows(text, path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        task = _task(row, line, path)
        task._row_hash = _hash_row(row)
        _resolve_paths(task, path.parent, allow_outside_paths, line, path)
        if row_check is not None:
            try:
                row_check(task)
            except (ValueError, TypeError) as exc:
                _fail(path, line, f"task {task.task_id!r}: {exc}")
        if task.task_id in seen:
            _fail(path, line, f"duplicate task id {task.task_id!r} (first on line {seen[task.task_id]})")
        seen[task.task_id] = line
        tasks.append(task)
    if not tasks:
        raise ConfigError("dataset holds no tasks", str(path))
    return tasks


PATH_FIELDS = ("repo_path", "task_archive")
"""Fields holding a path relative to the dataset file (made absolute on load), which a farm spread over machines
carries to the node that runs the task: a repository (bundle), a task directory's archive (Harbor tasks)."""
OUTSIDE_PATHS_OPTION = "dataset.allow_outside_paths"


def _resolve_paths(task: Task, base: Path, allow_outside: bool, line: int, path: Path) -> None:
    root = base.resolve()
    for name in PATH_FIELDS:
        value = task.data.get(name)
        if not isinstance(value, str) or not value:
            continue
        given = Path(value).expanduser()
        resolved = (given if given.is_absolute() else root / given).resolve()
        if not allow_outside and not resolved.is_relative_to(root):
            where = "is absolute" if given.is_absolute() else "leads out of the dataset's directory"
            _fail(path, line, f"field {name!r}: {value!r} {where}; allow such paths with {OUTSIDE_PATHS_OPTION}: "
                              "true (rollout eval / images build: --allow-outside-paths)")
        task.data[name] = str(resolved)


def select(
    tasks: list[Task],
    ids: Iterable[str] | None = None,
    pattern: str | None = None,
    slice_: str | slice | None = None,
) -> list[Task]:
    """Filter by exact ids (an unknown id is an error), then by regex on ``task_id``, then slice ("0:10")."""
    out = list(tasks)
    if ids is not None:
        wanted = [ids] if isinstance(ids, str) else list(ids)
        known = {t.task_id for t in out}
        missing = [i for i in wanted if i not in known]
        if missing:
            raise ConfigError(f"unknown task ids: {', '.join(map(str, missing[:10]))}", "dataset.ids")
        keep = set(wanted)
        out = [t for t in out if t.task_id in keep]
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"invalid regex {pattern!r}: {exc}", "dataset.pattern") from None
        out = [t for t in out if regex.search(t.task_id)]
    if slice_ is not None:
        out = out[slice_ if isinstance(slice_, slice) else parse_slice(slice_)]
    return out


def parse_slice(text: str) -> slice:
    """``"0:10"``, ``":5"``, ``"10:"``, ``"::2"`` → slice. A bare number is refused (index or count?)."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"slice {text!r} is not start:stop[:step] (use ':{text}' for the first {text})",
                          "dataset.slice")
    try:
        bounds = [int(p) if p.strip() else None for p in parts]
    except ValueError:
        raise ConfigError(f"slice {text!r} has a part that is not an integer", "dataset.slice") from None
    if len(bounds) == 3 and bounds[2] == 0:
        raise ConfigError("slice step cannot be zero", "dataset.slice")
    return slice(*bounds)


def row_hash(task: Task) -> str:
    """Hash (16 hex) of the dataset row a task came from; for a task built in code, of the task itself."""
    return task._row_hash or _hash_row(task.model_dump(mode="json"))


def _hash_row(row: Any) -> str:
    text = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def dataset_hash(path: str | Path) -> str:
    """First 16 hex digits of the sha256 of the file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


# ---- parsing --------------------------------------------------------------------------------


def task_from_row(row: Any, where: str = "task") -> Task:
    """One task as a dataset file writes it (``Task``'s own fields, or a flat row: an id, a prompt, every other
    field in ``data``): the one conversion for files and for tasks handed to ``RolloutFarm.generate``.
    ``ConfigError`` naming ``where`` and the field."""
    if isinstance(row, Task):
        return row
    try:
        return _task(row, 0, Path(where))
    except ConfigError as exc:
        raise ConfigError(exc.message.removeprefix("line 0: "), where) from None


def _task(row: Any, line: int, path: Path) -> Task:
    if not isinstance(row, dict):
        _fail(path, line, f"a task must be a JSON object, got {type_name(row)}")
    if "task_id" in row and set(row) <= TASK_FIELDS:
        fields, id_key = dict(row), "task_id"
    else:
        fields, id_key = _flat(row, line, path)
    task_id = fields.get("task_id")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        fields["task_id"] = task_id = str(task_id)  # numeric ids (QA sets) are common; keep them
    problem = id_problem(task_id)
    if problem:
        _fail(path, line, f"field {id_key!r}: task id {problem}")
    data = fields.get("data")
    if isinstance(data, dict) and "instance_id" in data and data["instance_id"] != task_id:
        problem = id_problem(data["instance_id"])  # SWE code reads the instance id from the data
        if problem:
            _fail(path, line, f"field 'data.instance_id': {problem}")
    try:
        return Task.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        _fail(path, line, f"field {where!r}: {err['msg']}")
    raise AssertionError("unreachable")


def _flat(row: dict[str, Any], line: int, path: Path) -> tuple[dict[str, Any], str]:
    id_key = next((k for k in ID_KEYS if k in row), None)
    if id_key is None:
        _fail(path, line, f"no task id (looked for {', '.join(ID_KEYS)})")
    prompt_key = next((k for k in PROMPT_KEYS if k in row), None)
    prompt = row[prompt_key] if prompt_key else None
    if prompt is not None and not isinstance(prompt, str):
        _fail(path, line, f"field {prompt_key!r} must be a string, got {type_name(prompt)}")
    fields: dict[str, Any] = {
        "task_id": row[id_key],
        "prompt": prompt,
        "data": {k: v for k, v in row.items() if k not in OWN_FIELDS},
    }
    for key in ("messages", "metadata"):
        if key in row:
            fields[key] = row[key]
    return fields, id_key
