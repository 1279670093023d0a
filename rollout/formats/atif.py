"""One rollout as an ATIF document (Agent Trajectory Interchange Format, ``ATIF-v1.8``): the trajectory file Harbor
and many agent projects read. ``to_atif(result, agent)`` gives a JSON-ready dict; ``atif_steps`` (beside it) says
how messages and model calls become steps.

What has no field of its own in ATIF goes to an ``extra``: the reward and the farm's counts in
``final_metrics.extra``; the rollout's identity and outcome in the root ``extra``; per step the turn, finish reason,
timings, format error, text actions and a token break in the step's ``extra``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollout.formats.atif_steps import atif_steps
from rollout.records import RolloutResult
from rollout.train.tokens import contiguity_breaks, has_token_data

ATIF_VERSION = "ATIF-v1.8"


@dataclass
class AtifAgent:
    """The ``agent`` object of a document: who produced the trajectory."""

    name: str
    """The agent's short name (the config's ``agent.type``, e.g. ``mini_swe``, ``tool_calling``, ``external``)."""
    version: str = "unknown"
    """The farm's version that ran it."""
    model_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def to_atif(result: RolloutResult, agent: AtifAgent | None = None) -> dict[str, Any] | None:
    """``result`` (with its trajectory) as an ATIF document, or None when it recorded no message at all (a rollout
    that failed before its first prompt: ATIF needs at least one step)."""
    trajectory = result.trajectory
    breaks = contiguity_breaks(trajectory.steps) if has_token_data(trajectory.steps) else []
    steps = atif_steps(trajectory, {b.turn: {"offset": b.offset, "expected": b.expected} for b in breaks})
    if not steps:
        return None
    agent = agent or AtifAgent(name="rollout-farm")
    described: dict[str, Any] = {"name": agent.name, "version": agent.version}
    if agent.model_name:
        described["model_name"] = agent.model_name
    if trajectory.tools:
        described["tool_definitions"] = trajectory.tools
    if agent.extra:
        described["extra"] = agent.extra
    session = f"{result.run_id}/{result.rollout_id}" if result.run_id else result.rollout_id
    doc: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": session,
        "trajectory_id": f"{session}.a{result.attempt}",
        "agent": described,
        "steps": steps,
        "final_metrics": _final_metrics(result, steps, [b.as_dict() for b in breaks]),
        "extra": _identity(result),
    }
    copied = sum(1 for s in steps if s.get("is_copied_context"))
    if copied:
        doc["notes"] = (f"{copied} step(s) marked is_copied_context are context the model was shown, not model calls "
                        "of this rollout (no metrics); final_metrics counts the rollout's own calls.")
    return doc


def _final_metrics(result: RolloutResult, steps: list[dict[str, Any]], breaks: list[dict[str, int]]) -> dict:
    calls = result.trajectory.steps
    prompt = sum(s.usage.prompt_tokens for s in calls)
    completion = sum(s.usage.completion_tokens for s in calls)
    extra: dict[str, Any] = {"reward": result.reward, "total_tokens": prompt + completion, "model_calls": len(calls),
                             "actions": sum(len(s.actions) for s in calls),
                             "format_errors": sum(s.format_error is not None for s in calls)}
    if result.trajectory.env_reward:
        extra["env_reward"] = result.trajectory.env_reward
    if breaks:
        extra["token_breaks"] = breaks
    return {"total_prompt_tokens": prompt, "total_completion_tokens": completion, "total_steps": len(steps),
            "extra": extra}


def _identity(result: RolloutResult) -> dict[str, Any]:
    """Which rollout this is and how it ended."""
    extra: dict[str, Any] = {
        "run_id": result.run_id, "rollout_id": result.rollout_id, "task_id": result.task_id,
        "sample_index": result.sample_index, "attempt": result.attempt, "group_id": result.group_id or None,
        "seed": result.seed, "status": result.status, "exit_reason": result.exit_reason.value,
        "exit_message": result.trajectory.exit_message, "submission": result.submission,
    }
    if result.error is not None:
        extra["error"] = {"type": result.error.type, "message": result.error.message,
                          "infrastructure": result.error.infrastructure}
    return {key: value for key, value in extra.items() if value is not None}
