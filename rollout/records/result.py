"""What a rollout came to: the RolloutResult (a results.jsonl line), its Reward, what it returns besides
(RolloutOutputs), how its attempts failed."""

from __future__ import annotations

import traceback as _traceback
from typing import Any, Literal

from pydantic import Field

from rollout.errors import ExitReason, exit_reason_of, is_retryable
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
        reason = exit_reason_of(exc)
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
            infrastructure=reason.is_infrastructure,
            retryable=is_retryable(exc),
        )


class Reward(Record):
    """A verifier's verdict, and nothing else: what a rollout returns besides goes to ``RolloutResult.outputs``."""

    value: float | None
    """The score; None: no verdict (the agent server's ``/v1/responses`` plays the tool loop alone). A rollout
    without one stays unscored: it counts in no reward mean, success rate or pass@k."""
    details: dict[str, Any] = Field(default_factory=dict)
    """How the score came about (a resources server's verify response, the SWE grade)."""


class RolloutOutputs(Record):
    """What a rollout returns besides its reward, never scored. The verifier that produces it records it on the
    result it verifies (``Verifier.verify``)."""

    response: dict[str, Any] | None = None
    """The rollout as a Responses object: the one ``/verify`` read (the agent server answers it)."""
    cookies: dict[str, str] = Field(default_factory=dict)
    """A resources server's cookies after a ``/v1/responses`` rollout: the caller's session goes on with them."""


class AttemptRecord(Record):
    attempt: int
    status: str
    exit_reason: ExitReason | None = None
    error: ErrorInfo | None = None
    seconds: float = 0.0
    node_id: str | None = None


Status = Literal["completed", "infra_failed"]

FAILURE_CAUSES: dict[ExitReason, str] = {
    ExitReason.STEP_LIMIT: "agent_exhausted_budget", ExitReason.TOKEN_LIMIT: "agent_exhausted_budget",
    ExitReason.TIME_LIMIT: "agent_exhausted_budget", ExitReason.FORMAT_ERRORS: "agent_exhausted_budget",
    ExitReason.ALL_TOOLS_FAILED: "agent_exhausted_budget", ExitReason.MODEL_ERROR: "model_provider_failed",
    ExitReason.RUNTIME_ERROR: "sandbox_failed", ExitReason.CONTAINER_START_FAILED: "sandbox_failed",
    ExitReason.ENVIRONMENT_ERROR: "sandbox_failed", ExitReason.VERIFIER_ERROR: "verifier_failed",
    ExitReason.WORKER_DIED: "harbor_failed", ExitReason.INTERNAL_ERROR: "harbor_failed",
    ExitReason.DEADLINE_EXCEEDED: "cancelled",
}
"""Harbor's failure cause (``FailureCause``) of each exit reason that is a failure; the task outcomes that are not
(submitted, natural completion, environment done) have none. Harbor's rule: the reward is a valid measurement
when nothing failed or the agent exhausted its own budget."""
DERIVED = ("failure_cause", "reward_valid")
"""Keys every results.jsonl line carries beside the fields, derived from the exit reason (dropped on reading):
``rollout.store.files.StoredResult`` adds them. The record itself has none of these hooks, so it keeps
pydantic-core's fast JSON path where results travel in bulk (a Python hook costs 2-3x there)."""


class RolloutResult(Record):
    """One finished (task, sample): the line a run appends to results.jsonl."""

    run_id: str = ""
    rollout_id: str
    task_id: str
    sample_index: int = 0
    attempt: int = 1
    status: Status
    """``completed``: a task outcome, rewarded (unless no verdict: ``reward`` None). ``infra_failed``: retried, never
    scored."""
    exit_reason: ExitReason
    reward: float | None = None
    reward_details: dict[str, Any] = Field(default_factory=dict)
    outputs: RolloutOutputs = Field(default_factory=RolloutOutputs)
    """What the rollout returns besides its reward (``RolloutOutputs``)."""
    submission: str | None = None
    trajectory: Trajectory = Field(default_factory=Trajectory)
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds: ``reset`` (the environment: a container start, a checkout), ``agent``, ``verify``, ``total``,
    ``wall`` (the driver's), ``queued`` (waiting on a full worker), ``backoff`` (before a retried attempt began)."""
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
    model_url: str | None = None
    """The API root (``.../v1``) the rollout's model calls went to: the model section's ``base_url``, or the URL the
    run set at run time (its Serve app's, its fake server's); None for a model in the worker's process."""

    @property
    def failure_cause(self) -> str | None:
        """Harbor's name for what ended the rollout when it was a failure (``FAILURE_CAUSES``), else None."""
        return FAILURE_CAUSES.get(ExitReason(self.exit_reason))

    @property
    def reward_valid(self) -> bool:
        """Whether the reward measures the agent: it completed, with no failure or only its budget spent."""
        return self.status == "completed" and self.failure_cause in (None, "agent_exhausted_budget")

    @property
    def is_infrastructure_failure(self) -> bool:
        return self.status == "infra_failed"

    @property
    def summary(self) -> EpisodeSummary:
        return self.trajectory.summary(self.reward)
