"""Limits and the one place every agent loop asks "does this rollout go on?".

Each check raises the matching task-outcome exception from ``rollout.errors``; the loops only
call the checks at the right points, so every agent ends for the same reasons in the same way.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.errors import (
    AllToolsFailed,
    FormatErrorLimitExceeded,
    StepLimitExceeded,
    TimeLimitExceeded,
    TokenLimitExceeded,
)
from rollout.protocols import ModelResponse
from rollout.records import Observation

FORMAT_ERROR_KINDS = frozenset({"unknown_tool", "invalid_arguments", "format_error"})
"""Observation ``info["error"]`` kinds that count as the model getting the format wrong."""


class Limits(BaseModel):
    """When a rollout stops, whatever the agent."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int | None = Field(default=None, ge=1)
    """Model calls per rollout; None for no limit."""
    max_total_tokens: int | None = Field(default=None, ge=1)
    """Prompt + completion tokens of the last call (the context in use); None for no limit."""
    time_limit: float | None = Field(default=None, gt=0)
    """Seconds of the agent's own time: from the end of the environment's reset, without the model's calls
    (a slow or failing model server is not the policy's doing). Passing it is the ``time_limit`` outcome."""
    model_time_limit: float | None = Field(default=None, gt=0)
    """Seconds the model's calls of one rollout may take together (generation, retries, backoff); passing it
    is an infrastructure failure (``model_error``), never a task outcome. None: the same as ``time_limit``."""
    max_consecutive_format_errors: int = Field(default=3, ge=1)
    """Rounds in a row whose output could not be parsed (unknown tools, bad arguments count)."""
    on_all_tools_failed: Literal["continue", "stop"] = "continue"
    """What to do when every tool call of a round failed."""

    @property
    def model_budget(self) -> float | None:
        """Seconds of model calls allowed per rollout (``model_time_limit``, else ``time_limit``)."""
        return self.model_time_limit if self.model_time_limit is not None else self.time_limit

    @classmethod
    def of(cls, config: BaseModel) -> "Limits":
        """The limits part of an agent config that extends Limits."""
        return cls(**{name: getattr(config, name) for name in cls.model_fields})


class Termination:
    """Tracks one rollout against its limits.

    Two clocks: the agent's (from ``start_clock``, at the end of the environment's reset, paused during model
    calls) against ``time_limit``, and the model's (the calls' total) against ``Limits.model_budget``.
    """

    def __init__(self, limits: Limits, clock=time.monotonic):
        self.limits = limits
        self._clock = clock
        self.started: float | None = None
        self.steps = 0
        self.consecutive_format_errors = 0
        self._model_total = 0.0
        self._model_since: float | None = None

    def start_clock(self) -> None:
        """The agent's time starts now (the environment is ready). Later calls change nothing."""
        if self.started is None:
            self.started = self._clock()

    @property
    def in_model_call(self) -> bool:
        return self._model_since is not None

    def agent_seconds(self) -> float:
        """The agent's own time so far: wall time since ``start_clock`` less the model's calls."""
        if self.started is None:
            return 0.0
        return self._clock() - self.started - self.model_seconds()

    def model_seconds(self) -> float:
        """Time spent in model calls so far, the one in flight included."""
        current = self._clock() - self._model_since if self._model_since is not None else 0.0
        return self._model_total + current

    def remaining_time(self) -> float | None:
        """The agent's time left before ``time_limit``; None without one."""
        limit = self.limits.time_limit
        return None if limit is None else max(0.0, limit - self.agent_seconds())

    def model_time_left(self) -> float | None:
        """Seconds of model calls left in the budget; None without one."""
        budget = self.limits.model_budget
        return None if budget is None else max(0.0, budget - self.model_seconds())

    def model_call_started(self) -> None:
        self.start_clock()  # an agent that never reset an environment: its time starts with its first call
        self._model_since = self._clock()

    def model_call_ended(self) -> None:
        if self._model_since is not None:
            self._model_total += self._clock() - self._model_since
            self._model_since = None

    def check(self) -> None:
        """Raises the outcome of a step or time limit already reached: does the rollout go on?"""
        if self.limits.max_steps is not None and self.steps >= self.limits.max_steps:
            raise StepLimitExceeded(f"reached max_steps={self.limits.max_steps}")
        limit = self.limits.time_limit
        if limit is not None and self.agent_seconds() >= limit:
            raise TimeLimitExceeded(f"reached time_limit={limit:g}s of the agent's own time")

    def before_model_call(self) -> None:
        """Called before each model call: the limits checked, the call counted."""
        self.start_clock()
        self.check()
        self.steps += 1

    def after_model_call(self, response: ModelResponse) -> None:
        """Output cut at max tokens, or the context budget spent."""
        if response.finish_reason == "length":
            raise TokenLimitExceeded("the model's output hit its max tokens (finish_reason=length)")
        budget = self.limits.max_total_tokens
        if budget is not None and response.usage.total_tokens >= budget:
            raise TokenLimitExceeded(f"context used {response.usage.total_tokens} >= max_total_tokens={budget}")

    def format_error(self, text: str) -> None:
        """A round whose output could not be turned into valid actions."""
        self.consecutive_format_errors += 1
        if self.consecutive_format_errors >= self.limits.max_consecutive_format_errors:
            raise FormatErrorLimitExceeded(
                f"{self.consecutive_format_errors} consecutive format errors; last: {text[:500]}"
            )

    def after_observations(self, observations: list[Observation]) -> None:
        """Counts format-kind tool failures, applies ``on_all_tools_failed``."""
        bad = [o for o in observations if not o.success and o.info.get("error") in FORMAT_ERROR_KINDS]
        if bad:
            self.format_error(bad[0].content)
        else:
            self.consecutive_format_errors = 0
        if (
            observations
            and self.limits.on_all_tools_failed == "stop"
            and all(not o.success for o in observations)
        ):
            raise AllToolsFailed(f"all {len(observations)} tool call(s) of step {self.steps} failed")
