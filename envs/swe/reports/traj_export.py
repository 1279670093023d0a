"""A rollout as a ``.traj.json`` in the shape mini-swe-agent 2.4.6 writes (format "mini-swe-agent-1.1"), for the
tools that read those: its inspector, analysis scripts, leaderboard checks. The messages are ``traj_messages``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envs.swe.reports.traj_messages import messages_with_extra
from rollout.errors import ExitReason
from rollout.records import RolloutResult

TRAJECTORY_FORMAT = "mini-swe-agent-1.1"
MINI_SWE_AGENT_VERSION = "2.4.6"
"""The mini-swe-agent release whose trajectory files these match (``info.format_of``). ``info.mini_version`` (the
release that wrote a file) is null: mini-swe-agent did not write ours; ``info.written_by`` says who did."""
WRITER = "rollout-farm"
EXIT_STATUS = {
    ExitReason.SUBMITTED: "Submitted",
    ExitReason.STEP_LIMIT: "LimitsExceeded",
    ExitReason.TOKEN_LIMIT: "LimitsExceeded",
    ExitReason.TIME_LIMIT: "TimeExceeded",
    ExitReason.FORMAT_ERRORS: "RepeatedFormatError",
}
"""Our exit reasons under the names mini-swe-agent gives them; other task outcomes are our reason in the same
CamelCase, an infrastructure failure its exception's type (as mini-swe-agent names an uncaught exception)."""
SECTIONS = ("agent", "model", "environment")
"""The config sections mini-swe-agent's ``info.config`` has, each beside ``<section>_type``."""
SECRET_KEYS = ("api_key", "api-key", "authorization", "password", "secret", "token")
"""Config keys ending so (in any case) are left out of ``info.config``: trajectory files get shared."""


def to_mini_swe_traj(result: RolloutResult | Mapping[str, Any], *,
                     config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"info": {model_stats, config, mini_version, exit_status, submission, ...}, "messages", "trajectory_format",
    "instance_id"}``, as mini-swe-agent's batch runner saves it.

    ``messages`` is the rollout's conversation (every ``content`` a string) with mini-swe-agent's per-message
    ``extra``: a reply's ``actions`` and ``timestamp``, an observation's ``raw_output``, ``returncode`` and
    ``timestamp``, a format error's ``interrupt_type``; then a last ``exit`` message with the exit status and
    the submission. ``config`` is the run's config (see ``info_config``). ``info`` also carries what
    mini-swe-agent has no field for: who wrote the file (``written_by``; ``mini_version`` is null, as no
    mini-swe-agent release wrote it), our exit reason, reward, resolved, ids, usage, timings. ``model.base_url`` in
    ``info.config`` is the URL the rollout's calls went to (``result.model_url``: a Serve app's, set at run time),
    not the section's default. A dict is read as a ``RolloutResult`` (a results.jsonl line's extra keys are
    ignored)."""
    if not isinstance(result, RolloutResult):
        result = RolloutResult.model_validate({k: v for k, v in result.items() if k in RolloutResult.model_fields})
    trajectory = result.trajectory
    status = exit_status(result)
    submission = result.submission or trajectory.submission or ""
    failure = {}
    if result.error is not None:
        failure = {"traceback": result.error.traceback, "exception_str": result.error.message}
    config = dict(config or {})
    if result.model_url and isinstance(config.get("model"), dict):
        config["model"] = {**config["model"], "base_url": result.model_url}
    info: dict[str, Any] = {
        # No prices here (served models, trainers): the cost is 0; one step is one model call.
        "model_stats": {"instance_cost": 0.0, "api_calls": len(trajectory.steps)},
        "config": info_config(config),
        "mini_version": None,
        "exit_status": status,
        "submission": submission,
        **failure,
        "written_by": f"{WRITER} {_version()}",
        "format_of": f"mini-swe-agent {MINI_SWE_AGENT_VERSION}",
        "exit_reason": result.exit_reason.value,
        "status": result.status,
        "reward": result.reward,
        "run_id": result.run_id,
        "rollout_id": result.rollout_id,
        "sample_index": result.sample_index,
        "attempt": result.attempt,
        "usage": result.usage.model_dump(),
        "timings": dict(result.timings),
    }
    if "resolved" in result.reward_details:
        info["resolved"] = bool(result.reward_details["resolved"])
    if trajectory.exit_message:
        info["exit_message"] = trajectory.exit_message
    if trajectory.tools:
        info["tools"] = trajectory.tools
    if status == "Submitted":
        content = submission
    elif result.error is not None:
        content = result.error.message
    else:
        content = status
    last = {"role": "exit", "content": content, "extra": {"exit_status": status, "submission": submission, **failure}}
    return {
        "info": info,
        "messages": [*messages_with_extra(trajectory), last],
        "trajectory_format": TRAJECTORY_FORMAT,
        "instance_id": result.task_id,
    }


def write_mini_swe_traj(path: str | Path, result: RolloutResult | Mapping[str, Any], *,
                        config: Mapping[str, Any] | None = None) -> Path:
    """Write ``to_mini_swe_traj(result)`` to ``path`` (parents created, replaced atomically); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_mini_swe_traj(result, config=config), indent=2, ensure_ascii=False, default=str)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def exit_status(result: RolloutResult) -> str:
    reason = result.exit_reason
    if reason in EXIT_STATUS:
        return EXIT_STATUS[reason]
    if reason.is_infrastructure and result.error is not None:
        return result.error.type
    return "".join(part.capitalize() for part in reason.value.split("_"))


def info_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``info.config``: ``agent``, ``agent_type``, ``model``, ``model_type``, ``environment``, ``environment_type``
    first, as mini-swe-agent writes them, then the run's other sections. A ``<section>_type`` the caller gives
    (a class path) is kept; else it is the section's ``type``. Secrets are left out."""
    rest = _without_secrets(dict(config or {}))
    out: dict[str, Any] = {}
    for section in SECTIONS:
        body = rest.pop(section, None)
        body = body if isinstance(body, dict) else {}
        out[section] = body
        out[f"{section}_type"] = str(rest.pop(f"{section}_type", None) or body.get("type", ""))
    return {**out, **rest}


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items()
                if not (isinstance(k, str) and k.lower().endswith(SECRET_KEYS))}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def _version() -> str:
    try:
        return importlib.metadata.version(WRITER)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
