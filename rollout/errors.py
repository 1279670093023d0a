"""The failure taxonomy: exit reasons, task outcomes vs infrastructure failures, exception types.

Task outcomes are the model's doing: final, and rewarded (possibly 0).
Infrastructure failures are not: labelled, retried up to ``max_attempts``, never scored 0.
Every exception here pickles (Ray moves them between processes): each stores its constructor
arguments in ``self.args`` order and rebuilds from them.
"""

from __future__ import annotations

from enum import Enum


class ExitReason(str, Enum):
    """Why a rollout ended. The first group are task outcomes, the second infrastructure."""

    SUBMITTED = "submitted"
    NATURAL_COMPLETION = "natural_completion"
    ENVIRONMENT_DONE = "environment_done"
    STEP_LIMIT = "step_limit"
    TOKEN_LIMIT = "token_limit"
    TIME_LIMIT = "time_limit"
    FORMAT_ERRORS = "format_errors"
    ALL_TOOLS_FAILED = "all_tools_failed"

    MODEL_ERROR = "model_error"
    RUNTIME_ERROR = "runtime_error"
    CONTAINER_START_FAILED = "container_start_failed"
    ENVIRONMENT_ERROR = "environment_error"
    VERIFIER_ERROR = "verifier_error"
    WORKER_DIED = "worker_died"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL_ERROR = "internal_error"

    @property
    def is_infrastructure(self) -> bool:
        return self in INFRASTRUCTURE_REASONS

    def __str__(self) -> str:  # "step_limit", not "ExitReason.STEP_LIMIT", in messages
        return self.value


INFRASTRUCTURE_REASONS = frozenset(
    {
        ExitReason.MODEL_ERROR,
        ExitReason.RUNTIME_ERROR,
        ExitReason.CONTAINER_START_FAILED,
        ExitReason.ENVIRONMENT_ERROR,
        ExitReason.VERIFIER_ERROR,
        ExitReason.WORKER_DIED,
        ExitReason.DEADLINE_EXCEEDED,
        ExitReason.INTERNAL_ERROR,
    }
)
TASK_OUTCOMES = frozenset(ExitReason) - INFRASTRUCTURE_REASONS


class RolloutError(Exception):
    """Base of every error this project raises on purpose."""

    exit_reason: ExitReason = ExitReason.INTERNAL_ERROR
    retryable: bool = True
    """Whether another attempt could end differently (``is_retryable``); an infrastructure error sets its own."""

    def __init__(self, message: str = ""):
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


# ---- control flow inside one rollout: these end it as a task outcome ----------------------


class TaskOutcome(RolloutError):
    """Ends a rollout with a final, rewarded outcome. ``submission`` carries a submitted answer."""

    exit_reason = ExitReason.NATURAL_COMPLETION

    def __init__(self, message: str = "", submission: str | None = None):
        super().__init__(message)
        self.args = (message, submission)
        self.submission = submission

    def __str__(self) -> str:
        return self.message


SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""A command whose output starts with this line submits (Mini-SWE); the rest of its output is the submission."""


class Submitted(TaskOutcome):
    exit_reason = ExitReason.SUBMITTED


class NaturalCompletion(TaskOutcome):
    exit_reason = ExitReason.NATURAL_COMPLETION


class EnvironmentDone(TaskOutcome):
    exit_reason = ExitReason.ENVIRONMENT_DONE


class StepLimitExceeded(TaskOutcome):
    exit_reason = ExitReason.STEP_LIMIT


class TokenLimitExceeded(TaskOutcome):
    """Output cut at max tokens, or the prompt no longer fits the context window."""

    exit_reason = ExitReason.TOKEN_LIMIT


class TimeLimitExceeded(TaskOutcome):
    exit_reason = ExitReason.TIME_LIMIT


class FormatErrorLimitExceeded(TaskOutcome):
    exit_reason = ExitReason.FORMAT_ERRORS


class AllToolsFailed(TaskOutcome):
    exit_reason = ExitReason.ALL_TOOLS_FAILED


class FormatError(RolloutError):
    """A model message that no action can be parsed from. Its text is fed back to the model."""

    exit_reason = ExitReason.FORMAT_ERRORS


class ContextLengthExceeded(TokenLimitExceeded):
    """The model server rejected the request because the prompt exceeds the context window."""


# ---- infrastructure: retried, never scored -------------------------------------------------


class InfrastructureError(RolloutError):
    """Not the model's doing. ``retryable`` says whether another attempt could succeed: the driver stops at the
    first failure that says it cannot (a task without the data its verifier needs runs once, not N times)."""

    exit_reason = ExitReason.INTERNAL_ERROR

    def __init__(self, message: str = "", retryable: bool = True):
        super().__init__(message)
        self.args = (message, retryable)
        self.retryable = retryable

    def __str__(self) -> str:
        return self.message


class ModelError(InfrastructureError):
    """The model endpoint is unreachable or keeps failing after bounded retries."""

    exit_reason = ExitReason.MODEL_ERROR


class RuntimeFailure(InfrastructureError):
    """A container or workspace died or stopped answering."""

    exit_reason = ExitReason.RUNTIME_ERROR


class ContainerStartError(RuntimeFailure):
    exit_reason = ExitReason.CONTAINER_START_FAILED


class EnvironmentFailure(InfrastructureError):
    """The environment (not the command the model ran) broke."""

    exit_reason = ExitReason.ENVIRONMENT_ERROR


class VerifierError(InfrastructureError):
    exit_reason = ExitReason.VERIFIER_ERROR


class WorkerDied(InfrastructureError):
    exit_reason = ExitReason.WORKER_DIED


class DeadlineExceeded(InfrastructureError):
    """The host-side deadline of one attempt (container start, agent and grading) passed: the attempt was
    cancelled and its containers removed. The agent's own ``time_limit`` is the task outcome; this is the
    backstop for what hangs beyond it."""

    exit_reason = ExitReason.DEADLINE_EXCEEDED


class AgentProtocolError(InfrastructureError):
    """An agent returned without raising its outcome: a bug in the agent, labelled as such."""

    exit_reason = ExitReason.INTERNAL_ERROR


class ConfigError(RolloutError):
    """A bad config or dataset. Raised before any work starts; the message names the field."""

    retryable = False  # a config problem that only shows at run time shows again

    def __init__(self, message: str = "", field: str = ""):
        super().__init__(message)
        self.args = (message, field)
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class NotSupported(RuntimeError):
    """The served model cannot do this (the reason says which engine and why): a trainer's control (pause modes,
    weight reloads, sleep) that its engine lacks. Raised to the caller; never a rollout's failure."""


def is_retryable(exc: BaseException) -> bool:
    """Whether another attempt could end differently. An infrastructure error says so itself (``retryable``);
    a config problem that only shows at run time never can; anything else (an untyped bug, a lost worker) may."""
    return exc.retryable if isinstance(exc, RolloutError) else True


ALL_ERROR_TYPES: tuple[type[RolloutError], ...] = (
    RolloutError,
    TaskOutcome,
    Submitted,
    NaturalCompletion,
    EnvironmentDone,
    StepLimitExceeded,
    TokenLimitExceeded,
    TimeLimitExceeded,
    FormatErrorLimitExceeded,
    AllToolsFailed,
    FormatError,
    ContextLengthExceeded,
    InfrastructureError,
    ModelError,
    RuntimeFailure,
    ContainerStartError,
    EnvironmentFailure,
    VerifierError,
    WorkerDied,
    DeadlineExceeded,
    AgentProtocolError,
    ConfigError,
)


def exit_reason_of(exc: BaseException) -> ExitReason:
    """The exit reason an exception stands for (an untyped error: ``internal_error``)."""
    return exc.exit_reason if isinstance(exc, RolloutError) else ExitReason.INTERNAL_ERROR
