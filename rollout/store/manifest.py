"""The run manifest (versions, git SHA, config and dataset hashes, seeds) and which config keys change results.

A resumed run must produce the same results as an uninterrupted one, so a run directory
refuses a config whose *result-affecting* keys differ from the stored one. Keys that only
change where files go, how fast the work runs or how the model server is reached do not
count; they are listed in ``NON_RESULT_KEYS``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import platform
import subprocess
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from rollout.errors import ConfigError

NON_RESULT_KEYS: tuple[str, ...] = (
    # Where results go and how they are shown.
    "output",
    "run_id",
    "run.id",
    # Retry policy: decides how often an infrastructure failure is retried, never a reward.
    "run.max_attempts",
    "run.retry_infra",
    "run.new_run",
    # Scale and placement: how many workers, where they run.
    "farm",
    "cluster",
    # How the model server is reached (not which model or how it samples).
    "model.base_url",
    "model.api_key*",
    "model.max_connections",
    "model.*timeout*",
    "model.*retries",
    "model.retry_*",
    # Which tasks and how many samples: widening either on resume just runs the new ones.
    "run.samples",
    "run.samples_per_task",
    "dataset.ids",
    "dataset.pattern",
    "dataset.slice",
    "dataset.allow_outside_paths",
    # Speed and injected faults of the test-double model server, not what it answers.
    "fake_server.latency",
    "fake_server.faults",
    # Where and how the served model runs (not which model, policy or engine arguments).
    "serve.name",
    "serve.route_prefix",
    "serve.host",
    "serve.port",
    "serve.replicas",
    "serve.max_ongoing_requests",
    "serve.router",
    "serve.session_ttl",
    "serve.deployment",
    "serve.keep",
    "serve.latency",
    "serve.faults",
    "serve.controls",
    "serve.ready_timeout",
    "model.release_sessions",
    "model.backoff",
    "model.max_backoff",
    "model.max_concurrency",
    # Anywhere in the tree: parallelism and chattiness.
    "*concurrency*",
    "*progress*",
    "*verbos*",
    "*.log_level",
)
"""Dotted paths (``fnmatch`` patterns) whose value never changes a rollout's result.

A pattern matches a key and everything below it: ``"farm"`` covers ``farm.workers``.
Everything not listed here is result-affecting: model name and sampling, agent, environment,
runtime and verifier settings, limits, seeds, the dataset file.
"""


def is_result_key(path: str) -> bool:
    """Whether the dotted ``path`` is result-affecting (not under any ``NON_RESULT_KEYS`` pattern)."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return not any(fnmatchcase(p, pat) for p in prefixes for pat in NON_RESULT_KEYS)


def result_affecting(config: dict[str, Any], _prefix: str = "") -> dict[str, Any]:
    """``config`` without the keys listed in ``NON_RESULT_KEYS`` (nested mappings kept, emptied ones dropped)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{_prefix}{key}"
        if not is_result_key(path):
            continue
        if isinstance(value, dict):
            inner = result_affecting(value, path + ".")
            if inner or not value:
                out[key] = inner
        else:
            out[key] = value
    return out


def diff_result_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Sorted dotted paths of result-affecting leaves that differ (added, removed or changed)."""
    a, b = _leaves(_canonical(result_affecting(old))), _leaves(_canonical(result_affecting(new)))
    return sorted(k for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))


def config_hash(config: dict[str, Any]) -> str:
    """sha256 (16 hex) of the canonical JSON of the result-affecting config."""
    text = json.dumps(_canonical(result_affecting(config)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_manifest(config: dict[str, Any], dataset_path: str | Path | None, seeds: dict[str, Any],
                   rows: dict[str, str] | None = None) -> dict[str, Any]:
    """What produced this run: code and package versions, git state, hashes, seeds, time. ``rows``: the
    selected tasks' row hashes (task id -> ``rollout.data.dataset.row_hash``), compared when the run resumes."""
    from rollout.data.dataset import dataset_hash  # local: dataset.py imports records, keep this module light

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


class RunConfigChanged(ConfigError):
    """The stored config differs from this one in keys that change results."""

    def __init__(self, keys: list[str], run_dir: str = ""):
        where = f" of {run_dir}" if run_dir else ""
        super().__init__(
            f"config{where} changed in result-affecting keys: {', '.join(keys)}; "
            "pass --new-run to start a new run (old files are kept under previous-*/)",
            "config",
        )
        self.keys, self.run_dir = list(keys), run_dir

    def __reduce__(self):  # rebuild from keys (``args`` keeps ConfigError's (message, field) for ``str``)
        return type(self), (self.keys, self.run_dir)


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


_MISSING = object()


def _canonical(value: Any) -> Any:
    """What the value looks like after a JSON round trip (tuples → lists, paths → strings)."""
    return json.loads(json.dumps(value, default=str))


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree} if prefix else {}
