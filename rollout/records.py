"""The records a rollout reads and writes: Task, Action, Observation, Step, Trajectory, RolloutResult.
Pydantic models (JSON and pickle); messages stay plain dicts in the OpenAI chat format."""

from __future__ import annotations

import traceback as _traceback
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from rollout.errors import ExitReason, is_retryable

Message = dict[str, Any]
"""One chat message: ``{"role": ..., "content": ..., "tool_calls"?: [...], "tool_call_id"?: ...}``."""


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False, ser_json_inf_nan="constants")


class Task(Record):
    """One unit of work. ``data`` holds whatever the environment and verifier need."""

    task_id: str
    prompt: str | None = None
    """The user's request; becomes the first user message unless ``messages`` is given."""
    messages: list[Message] | None = None
    """A full opening conversation, used as is."""
    data: dict[str, Any] = Field(default_factory=dict)
    """Environment/verifier inputs (expected answer, SWE-bench fields, ...)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Carried through to the result, never interpreted."""
    _row_hash: str | None = PrivateAttr(default=None)
    """Hash of the dataset row this task was read from (set by ``rollout.data.dataset.load_tasks``)."""

    def opening_messages(self, system_prompt: str | None = None) -> list[Message]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        out: list[Message] = []
        if system_prompt:
            out.append({"role": "system", "content": system_prompt})
        out.append({"role": "user", "content": self.prompt or ""})
        return out


class Usage(Record):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class RequestMeta(Record):
    """The rollout's identity, sent with every model request (served policies, replica affinity)."""

    rollout_id: str = ""
    task_id: str = ""
    sample_index: int = 0
    attempt: int = 1
    run_id: str = ""
    seed: int | None = None
    group_id: str = ""
    """The group this sample belongs to (n samples of one task, GRPO style); ``sample_index`` is its index."""
    policy_version: str | None = None
    """The policy version the request is sampled under (``set_policy_version``; ``cache_salt`` salts with it)."""


class Action(Record):
    """One thing the model asked for: a tool call, a shell command, or a text action."""

    kind: Literal["tool", "bash", "text"] = "tool"
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = None
    """``tool_calls[i].id`` for OpenAI function calling; the tool reply refers to it."""
    raw: str = ""


class Observation(Record):
    """What the environment answered to one action."""

    content: str
    success: bool = True
    call_id: str | None = None
    action_name: str = ""
    done: bool = False
    """The environment ended the episode."""
    reward: float | None = None
    """Reward handed out by a step environment for this action."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Runtime details: returncode, timed_out, truncated, duration."""


class Step(Record):
    """One turn (round): the model's output, the actions parsed from it, what they produced."""

    index: int
    """Round number, 1-based."""
    message: Message
    """The assistant message the model produced."""
    finish_reason: str | None = None
    actions: list[Action] = Field(default_factory=list)
    observations: list[Observation] = Field(default_factory=list)
    format_error: str | None = None
    termination_reason: ExitReason | None = None
    """Set on the step that ended the rollout."""
    started_at: float = 0.0
    model_seconds: float = 0.0
    env_seconds: float = 0.0
    usage: Usage = Field(default_factory=Usage)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: str | None = None

    @property
    def tools_used(self) -> list[str]:
        return [a.name for a in self.actions]

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        return [{"name": o.action_name, "success": o.success, "content": o.content} for o in self.observations]


class EpisodeSummary(Record):
    num_turns: int = 0
    num_tool_calls: int = 0
    successful_tool_calls: int = 0
    format_errors: int = 0
    tools_used: list[str] = Field(default_factory=list)
    """Distinct tool names in first-use order."""
    total_reward: float = 0.0
    exit_reason: ExitReason | None = None


class Trajectory(Record):
    """The whole conversation (append-only) and the per-step records."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    steps: list[Step] = Field(default_factory=list)
    exit_reason: ExitReason | None = None
    exit_message: str | None = None
    """Why the episode ended, in words (e.g. the server's refusal behind a ``token_limit``)."""
    submission: str | None = None
    env_reward: float = 0.0
    """Sum of rewards a step environment handed out along the way."""

    def summary(self, reward: float | None = None) -> EpisodeSummary:
        used: list[str] = []
        calls = ok = fmt = 0
        for step in self.steps:
            fmt += step.format_error is not None
            for obs in step.observations:
                calls += 1
                ok += obs.success
            for name in step.tools_used:
                if name not in used:
                    used.append(name)
        return EpisodeSummary(
            num_turns=len(self.steps),
            num_tool_calls=calls,
            successful_tool_calls=ok,
            format_errors=fmt,
            tools_used=used,
            total_reward=self.env_reward if reward is None else reward,
            exit_reason=self.exit_reason,
        )


class ErrorInfo(Record):
    type: str
    message: str
    traceback: str = ""
    infrastructure: bool = True
    retryable: bool = True
    """Whether another attempt could end differently; False: the driver does not try again (``--retry-infra`` does)."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> "ErrorInfo":
        reason = getattr(exc, "exit_reason", ExitReason.INTERNAL_ERROR)
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
            infrastructure=isinstance(reason, ExitReason) and reason.is_infrastructure,
            retryable=is_retryable(exc),
        )


class Reward(Record):
    value: float
    details: dict[str, Any] = Field(default_factory=dict)


class AttemptRecord(Record):
    attempt: int
    status: str
    exit_reason: ExitReason | None = None
    error: ErrorInfo | None = None
    seconds: float = 0.0
    node_id: str | None = None


Status = Literal["completed", "infra_failed"]


class RolloutResult(Record):
    """One finished (task, sample): the line a run appends to results.jsonl."""

    run_id: str = ""
    rollout_id: str
    task_id: str
    sample_index: int = 0
    attempt: int = 1
    status: Status
    """``completed``: a task outcome, rewarded. ``infra_failed``: retried, never scored."""
    exit_reason: ExitReason
    reward: float | None = None
    reward_details: dict[str, Any] = Field(default_factory=dict)
    submission: str | None = None
    trajectory: Trajectory = Field(default_factory=Trajectory)
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds: queue, setup, agent, verify, total."""
    usage: Usage = Field(default_factory=Usage)
    error: ErrorInfo | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    group_id: str = ""
    """The group of n samples of one task this result belongs to; ``sample_index`` is its index in it."""
    seed: int | None = None
    """The seed passed to the model for this sample."""
    node_id: str | None = None
    """The farm node (Ray node id) that ran this attempt; None when it ran in the driver's process."""
    worker: str | None = None
    """``<hostname>:<pid>`` of the worker process that ran it."""

    @property
    def is_infrastructure_failure(self) -> bool:
        return self.status == "infra_failed"

    @property
    def summary(self) -> EpisodeSummary:
        return self.trajectory.summary(self.reward)
