"""What a rollout came to: the RolloutResult (a results.jsonl line), its Reward, how its attempts failed."""

from __future__ import annotations

import traceback as _traceback
from typing import Any, Literal

from pydantic import Field

from rollout.errors import ExitReason, is_retryable
from rollout.records.base import Record
from rollout.records.trajectory import EpisodeSummary, Trajectory, Usage


class ErrorInfo(Record):
    type: str
    message: str
    traceback: str = ""
    infrastructure: bool = True
    retryable: bool = True
    """Whether another attempt could end differently; False: the driver does not try again (``--retry-infra`` does)."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
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
