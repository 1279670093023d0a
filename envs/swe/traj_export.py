"""A rollout as a mini-swe-agent ``.traj.json`` (format "mini-swe-agent-1"), for the tools that read those."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.errors import ExitReason
from rollout.records import Message, RolloutResult

TRAJECTORY_FORMAT = "mini-swe-agent-1"
EXIT_STATUS = {
    ExitReason.SUBMITTED: "Submitted",
    ExitReason.STEP_LIMIT: "LimitsExceeded",
    ExitReason.TOKEN_LIMIT: "LimitsExceeded",
    ExitReason.TIME_LIMIT: "LimitsExceeded",
    ExitReason.FORMAT_ERRORS: "FormatError",
}
"""Our exit reasons under the names mini-swe-agent gives them (its exception class names); other task
outcomes are our reason in the same CamelCase, an infrastructure failure its exception's type."""


def to_mini_swe_traj(result: RolloutResult | Mapping[str, Any], *,
                     config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"trajectory_format", "instance_id", "info": {exit_status, submission, model_stats, ...}, "messages"}``.

    ``messages`` is the rollout's conversation with every ``content`` a string (as mini-swe-agent writes
    them; other keys such as ``tool_calls`` are kept). ``info`` also carries what mini-swe-agent has no
    field for: our exit reason, reward, resolved, ids, usage, timings and an error's traceback. ``config``
    (the run's resolved config) goes to ``info.config``. A dict is read as a ``RolloutResult`` (a
    results.jsonl line's extra keys are ignored)."""
    if not isinstance(result, RolloutResult):
        result = RolloutResult.model_validate({k: v for k, v in result.items() if k in RolloutResult.model_fields})
    trajectory = result.trajectory
    info: dict[str, Any] = {
        "exit_status": exit_status(result),
        "submission": result.submission or trajectory.submission or "",
        # No prices here (served models, trainers): the cost is 0; one step is one model call.
        "model_stats": {"instance_cost": 0.0, "api_calls": len(trajectory.steps)},
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
    if trajectory.tools:
        info["tools"] = trajectory.tools
    if result.error is not None:
        info["error"] = f"{result.error.type}: {result.error.message}"
        info["traceback"] = result.error.traceback
    if config is not None:
        info["config"] = dict(config)
    return {
        "trajectory_format": TRAJECTORY_FORMAT,
        "instance_id": result.task_id,
        "info": info,
        "messages": [_message(m) for m in trajectory.messages],
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


def _message(message: Message) -> Message:
    """A copy whose content is a string: text parts joined, none as ""."""
    out = dict(message)
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        out["content"] = "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return out
