"""The model gateway's record of a rollout's calls (``GET /rollouts/<id>/calls``: each call's messages, reply,
token ids, logprobs, and the call it extends) as trajectory steps with token data: the one reading of that wire
format, for the gateway that records it and the agents farmed through it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rollout.context import message_text
from rollout.records import Action, Message, Observation, Step, Usage
from rollout.train.tokens import Segment, TokenBreak, contiguity_breaks, has_token_data, segments


@dataclass
class CallSteps:
    """A rollout's recorded gateway calls as trajectory steps, their token segments and contiguity breaks."""

    steps: list[Step]
    segments: list[Segment] = field(default_factory=list)
    """``rollout.train.tokens.segments`` of the steps (empty without token data on every step)."""
    breaks: list[TokenBreak] = field(default_factory=list)
    """``rollout.train.tokens.contiguity_breaks``: where a step's prompt does not extend the one before."""
    messages: list[Message] = field(default_factory=list)
    """The conversation of the last answered call: its messages and its reply."""
    tools: list[dict[str, Any]] | None = None
    """The tools of the last answered call."""


def calls_to_steps(calls: Sequence[Mapping[str, Any]]) -> CallSteps:
    """The gateway's calls of one rollout (``GET /rollouts/<id>/calls``) as Steps with token data. Answered calls
    only; one conversation (``segment``) after another, in call order within each, so the calls of interleaved
    conversations (sub-agents) stay contiguous. A step's observations are the messages its first continuation
    added after its reply (tool results, user turns)."""
    done = sorted((c for c in calls if c.get("message") is not None),
                  key=lambda c: (c.get("segment") or c["index"], c["index"]))
    first_child: dict[int, Mapping[str, Any]] = {}
    for call in sorted(done, key=lambda c: c["index"]):
        first_child.setdefault(call.get("parent"), call)
    steps = []
    for k, call in enumerate(done, start=1):
        message = dict(call["message"])
        actions = [_action(tc) for tc in message.get("tool_calls") or [] if isinstance(tc, dict)]
        child = first_child.get(call["index"])
        added = child["messages"][len(call["messages"]) + 1:] if child else []
        names = {a.call_id: a.name for a in actions}
        observations = [Observation(content=message_text(m), call_id=m.get("tool_call_id"),
                                    action_name=names.get(m.get("tool_call_id"), str(m.get("role") or "")))
                        for m in added]
        usage = call.get("usage") or {}
        steps.append(Step(
            index=k, message=message, finish_reason=call.get("finish_reason"), actions=actions,
            observations=observations, started_at=call.get("started_at") or 0.0,
            model_seconds=call.get("seconds") or 0.0,
            usage=Usage(**{n: usage.get(n) or 0 for n in ("prompt_tokens", "completion_tokens", "total_tokens")}),
            prompt_token_ids=call.get("prompt_token_ids"), completion_token_ids=call.get("completion_token_ids"),
            logprobs=call.get("logprobs"), policy_version=call.get("policy_version"),
        ))
    out = CallSteps(steps)
    if has_token_data(steps):
        out.segments, out.breaks = segments(steps), contiguity_breaks(steps)
    if done:
        last = max(done, key=lambda c: c["index"])
        out.messages, out.tools = [*last["messages"], dict(last["message"])], last.get("tools")
    return out


def _action(call: Mapping[str, Any]) -> Action:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        arguments = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    text = raw if isinstance(raw, str) else json.dumps(raw)
    return Action(kind="tool", name=str(fn.get("name") or ""), arguments=arguments, call_id=call.get("id"), raw=text)
