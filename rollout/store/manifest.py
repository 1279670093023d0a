"""The run manifest: versions, git SHA, config and dataset hashes (the dataset's rows one by one), seeds, and
the earlier segments of a resumed run; which dataset rows changed since their results were written. Which config
keys change results is ``rollout.store.result_keys``."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from rollout.data.dataset import dataset_hash
from rollout.errors import ConfigError
from rollout.store.result_keys import config_hash


def build_manifest(config: dict[str, Any], dataset_path: str | Path | None, seeds: dict[str, Any],
                   rows: dict[str, str] | None = None) -> dict[str, Any]:
    """What produced this run: code and package versions, git state, hashes, seeds, time. ``rows``: the
    selected tasks' row hashes (task id -> ``rollout.data.dataset.row_hash``), compared when the run resumes."""
    sha, dirty = git_state()
    dataset = None
    if dataset_path is not None:
        path = Path(dataset_path)
        if str(dataset_path).startswith("hf://"):
            dataset = {"path": str(dataset_path), "hash": None}
        else:
            dataset = {"path": str(path.resolve()), "hash": dataset_hash(path) if path.is_file() else None}
    if rows is not None:
        dataset = {**(dataset or {"path": None, "hash": None}), "rows": dict(rows)}
    return {
        "package": "rollout-farm",
        "version": _version("rollout-farm") or "unknown",
        "git_sha": sha,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "packages": package_versions(),
        "config_hash": config_hash(config),
        "dataset": dataset,
        "seeds": dict(seeds),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


class DatasetChanged(ConfigError):
    """Dataset rows whose stored results came from a different version of the row."""

    def __init__(self, ids: list[str], run_dir: str = ""):
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        where = f" of {run_dir}" if run_dir else ""
        super().__init__(f"{len(ids)} dataset row(s) changed since their results{where} were written: {shown}; "
                         "pass --new-run to start a new run (old files are kept under previous-*/), or restore "
                         "the rows", "dataset")
        self.ids, self.run_dir = list(ids), run_dir

    def __reduce__(self):
        return type(self), (self.ids, self.run_dir)


def changed_rows(previous: dict[str, Any], manifest: dict[str, Any], with_results: set[str]) -> list[str]:
    """Task ids with stored results whose dataset row hash differs between the stored and the new manifest
    (rows new to the run, or never run, may change freely; manifests without ``dataset.rows`` compare nothing)."""
    rows = (manifest.get("dataset") or {}).get("rows") or {}
    old_rows = (previous.get("dataset") or {}).get("rows") or {}
    return sorted(i for i, h in rows.items() if i in with_results and old_rows.get(i, h) != h)


def resumed_manifest(previous: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a resumed run: this segment's, every earlier one under ``history`` (results may come from
    different code), and the row hashes of tasks not selected this time kept as their results came from."""
    rows = (manifest.get("dataset") or {}).get("rows")
    if rows is not None:
        old_rows = (previous.get("dataset") or {}).get("rows") or {}
        manifest = {**manifest, "dataset": {**manifest["dataset"], "rows": {**old_rows, **rows}}}
    history = previous.pop("history", [])
    (previous.get("dataset") or {}).pop("rows", None)  # the top level has them all
    return {**manifest, "history": [*history, previous]}


KEY_PACKAGES = ("pydantic", "aiohttp", "pyyaml", "jinja2", "ray", "docker", "vllm", "openai")


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape results, read from metadata (nothing is imported)."""
    return {name: v for name in KEY_PACKAGES if (v := _version(name))}


def git_state(cwd: str | Path | None = None) -> tuple[str | None, bool | None]:
    """``(HEAD sha, dirty)`` of the working tree at ``cwd``; ``(None, None)`` outside git or without git.

    Dirty means tracked files differ from HEAD; untracked files (a ``runs/`` directory) do not count.
    """
    sha = _git(["rev-parse", "HEAD"], cwd)
    if sha is None:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return sha, (bool(status) if status is not None else None)


def _git(args: list[str], cwd: str | Path | None) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, errors="replace", timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
