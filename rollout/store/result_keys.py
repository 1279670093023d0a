"""Which config keys change results. A resumed run must produce the same results as an uninterrupted one, so a
run directory refuses a config whose *result-affecting* keys differ from the stored one. Keys that only change
where files go, how fast the work runs or how the model server is reached do not count; they are listed in
``NON_RESULT_KEYS``."""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatchcase
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
    "serve.in_process",
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
