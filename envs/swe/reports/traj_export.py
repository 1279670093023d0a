"""A rollout as the ``.traj.json`` mini-swe-agent 2.4.6 writes (format "mini-swe-agent-1.1"), for the tools that
read those: its inspector, analysis scripts, leaderboard checks."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.errors import ExitReason
from rollout.records import Action, Message, Observation, RolloutResult, Step, Trajectory

TRAJECTORY_FORMAT = "mini-swe-agent-1.1"
MINI_SWE_AGENT_VERSION = "2.4.6"
"""The mini-swe-agent release whose trajectory files these match (``info.mini_version``)."""
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
    mini-swe-agent has no field for: our exit reason, reward, resolved, ids, usage, timings. A dict is read as a
    ``RolloutResult`` (a results.jsonl line's extra keys are ignored)."""
    if not isinstance(result, RolloutResult):
        result = RolloutResult.model_validate({k: v for k, v in result.items() if k in RolloutResult.model_fields})
    trajectory = result.trajectory
    status = exit_status(result)
    submission = result.submission or trajectory.submission or ""
    failure = {}
    if result.error is not None:
        failure = {"traceback": result.error.traceback, "exception_str": result.error.message}
    info: dict[str, Any] = {
        # No prices here (served models, trainers): the cost is 0; one step is one model call.
        "model_stats": {"instance_cost": 0.0, "api_calls": len(trajectory.steps)},
        "config": info_config(config),
        "mini_version": MINI_SWE_AGENT_VERSION,
        "exit_status": status,
        "submission": submission,
        **failure,
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


def messages_with_extra(trajectory: Trajectory) -> list[Message]:
    """The conversation, each message a copy with a string ``content`` and, when a step recorded it, the
    ``extra`` mini-swe-agent gives it. A step's reply is found by equality; the messages after it until the
    next reply are its observations (by tool call id, else in order) or its format error's feedback."""
    replies: dict[int, Step] = {}
    steps = trajectory.steps
    for i, message in enumerate(trajectory.messages):
        if len(replies) < len(steps) and message == steps[len(replies)].message:
            replies[i] = steps[len(replies)]
    out: list[Message] = []
    step: Step | None = None
    after = 0
    for i, message in enumerate(trajectory.messages):
        copy = _message(message)
        extra: dict[str, Any] | None = None
        if i in replies:
            step, after = replies[i], 0
            extra = _reply_extra(step)
        elif step is not None:
            extra = _follower_extra(step, after, copy)
            after += 1
        if extra is not None:
            copy["extra"] = {**extra, **(copy.get("extra") or {})}
        out.append(copy)
    return out


def _reply_extra(step: Step) -> dict[str, Any]:
    return {"actions": [_action(a) for a in step.actions], "cost": 0.0, "timestamp": _reply_time(step),
            "finish_reason": step.finish_reason, "usage": step.usage.model_dump()}


def _follower_extra(step: Step, index: int, message: Message) -> dict[str, Any] | None:
    if step.format_error is not None:
        return {"interrupt_type": "FormatError", "model_response": _message(step.message)["content"]}
    times = _observation_times(step)
    call_id = message.get("tool_call_id")
    for j, obs in enumerate(step.observations):
        if call_id is not None and obs.call_id == call_id:
            return _observation_extra(obs, times[j])
    if index < len(step.observations):
        return _observation_extra(step.observations[index], times[index])
    return None


def _action(action: Action) -> dict[str, Any]:
    command = action.arguments.get("command")
    out: dict[str, Any] = {"command": command} if isinstance(command, str) else {
        "name": action.name, "arguments": action.arguments}
    if action.call_id is not None:
        out["tool_call_id"] = action.call_id
    return out


def _observation_extra(obs: Observation, timestamp: float) -> dict[str, Any]:
    """What mini-swe-agent keeps of a command's run, from what our environment recorded in ``info``."""
    info = obs.info
    timed_out = bool(info.get("timed_out"))
    returncode = info.get("returncode")
    if returncode is None:
        returncode = -1 if timed_out else 0 if obs.success else 1
    exception = ""
    if timed_out:
        limit = info.get("timeout")
        exception = "the command timed out" + (f" after {limit:g} seconds" if isinstance(limit, (int, float)) else "")
    rest = {k: v for k, v in info.items() if k not in ("returncode", "command")}
    return {"raw_output": obs.content, "returncode": returncode, "timestamp": timestamp, "exception_info": exception,
            **rest}


def _reply_time(step: Step) -> float:
    """When the reply arrived: the model call's start plus its duration."""
    return step.started_at + step.model_seconds


def _observation_times(step: Step) -> list[float]:
    """When each action finished: after the reply, one duration after another (the step's time split evenly
    when an observation has none)."""
    now, share = _reply_time(step), step.env_seconds / max(1, len(step.observations))
    times = []
    for obs in step.observations:
        duration = obs.info.get("duration")
        now += float(duration) if isinstance(duration, (int, float)) else share
        times.append(now)
    return times


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items()
                if not (isinstance(k, str) and k.lower().endswith(SECRET_KEYS))}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def _message(message: Message) -> Message:
    """A copy whose content is a string: text parts joined, none as ""."""
    out = dict(message)
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        out["content"] = "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return out
