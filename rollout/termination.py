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
    """Wall-clock seconds for the agent loop."""
    max_consecutive_format_errors: int = Field(default=3, ge=1)
    """Rounds in a row whose output could not be parsed (unknown tools, bad arguments count)."""
    on_all_tools_failed: Literal["continue", "stop"] = "continue"
    """What to do when every tool call of a round failed."""

    @classmethod
    def of(cls, config: BaseModel) -> "Limits":
        """The limits part of an agent config that extends Limits."""
        return cls(**{name: getattr(config, name) for name in cls.model_fields})


class Termination:
    """Tracks one rollout against its limits."""

    def __init__(self, limits: Limits, clock=time.monotonic):
        self.limits = limits
        self._clock = clock
        self.started = clock()
        self.steps = 0
        self.consecutive_format_errors = 0

    @property
    def deadline(self) -> float | None:
        return None if self.limits.time_limit is None else self.started + self.limits.time_limit

    def remaining_time(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - self._clock())

    def before_model_call(self) -> None:
        """Called before each model call: step and time limits."""
        if self.limits.max_steps is not None and self.steps >= self.limits.max_steps:
            raise StepLimitExceeded(f"reached max_steps={self.limits.max_steps}")
        if self.deadline is not None and self._clock() >= self.deadline:
            raise TimeLimitExceeded(f"reached time_limit={self.limits.time_limit}s")
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
