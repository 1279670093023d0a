"""What happened in a rollout, turn by turn: Action, Observation, Step, Trajectory (and its EpisodeSummary), Usage."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rollout.errors import ExitReason
from rollout.records.base import Message, Record


class Usage(Record):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


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
