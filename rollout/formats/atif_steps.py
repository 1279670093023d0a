"""A trajectory's messages and recorded model calls as ATIF steps (``rollout.formats.atif`` wraps them in a document).

The conversation (``Trajectory.messages``, append-only) says what the model was shown; the recorded steps
(``Trajectory.steps``, one per model call) say what it produced, with its token data. Each step's reply is found in
the conversation, in order; then:

- the messages before the first reply become ``system`` / ``user`` steps (the prompt);
- each reply becomes an ``agent`` step (``llm_call_count: 1``, its ``metrics`` holding the run's own token ids and
  logprobs); native ``tool_calls`` become ATIF tool calls, text actions (a bash block, ReAct, JSON in text) stay in
  the message, as the model wrote them, and are listed in the step's ``extra.actions``;
- the messages after a reply (tool results, rendered command output, format-error feedback) are its observation,
  as the model saw them; a tool message's ``tool_call_id`` is the result's ``source_call_id``. A step whose results
  went back to no model (the submitting command) gets its recorded observations instead;
- an assistant message no recorded call produced (a task's few-shot turns, turns re-sent in a rewritten prompt, the
  calls a gateway dropped) and a later conversation's re-sent opening are context, not this rollout's model calls:
  ``is_copied_context: true``, no metrics, so a trainer skips them;
- a recorded call whose reply is not in the conversation (an external agent's earlier or interleaved conversation)
  becomes an agent step with its recorded observations.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from rollout.context import message_text
from rollout.records import Message, Observation, Step, Trajectory

SYSTEM_ROLES = ("system", "developer")
ORDER = ["step_id", "timestamp", "source", "message", "reasoning_content", "tool_calls", "observation", "metrics",
         "llm_call_count", "is_copied_context", "extra"]
"""The keys of a step object, in the order they are written."""


def atif_steps(trajectory: Trajectory, breaks: dict[int, dict[str, int]] | None = None) -> list[dict[str, Any]]:
    """The trajectory as ATIF step objects (plain dicts, ``step_id`` 1..n). ``breaks``: the 1-based turns whose
    prompt does not extend the previous turn's tokens (``rollout.train.tokens.contiguity_breaks``), by turn."""
    return _Builder(trajectory, breaks or {}).build()


class _Builder:
    def __init__(self, trajectory: Trajectory, breaks: dict[int, dict[str, int]]):
        self.messages, self.steps, self.breaks = trajectory.messages, trajectory.steps, breaks
        self.out: list[dict[str, Any]] = []
        self.holder: dict[str, Any] | None = None
        """The latest agent step of the conversation after its first recorded reply: the messages after it are its
        observation. Before that reply the messages are the prompt: system and user steps."""
        self.opening_call: dict[str, Any] | None = None
        """The latest copied agent step of the prompt (a tool message answering it is its observation)."""
        self.recorded_out = False
        """Whether a recorded model call is in ``out`` yet (a conversation's opening after one is re-sent context)."""

    def build(self) -> list[dict[str, Any]]:
        position = _positions(self.messages, self.steps)
        cursor = 0
        pending: list[tuple[dict[str, Any], Step]] = []
        for index, step in enumerate(self.steps):
            at = position.get(index)
            if at is None:
                self._emit(self._agent(step, shown=False), step)
                continue
            self._context(cursor, at)
            self.holder, self.opening_call = self._emit(self._agent(step, shown=True), step), None
            pending.append((self.holder, step))
            cursor = at + 1
        self._context(cursor, len(self.messages))
        for agent, step in pending:  # results that went back to no model: the recorded ones
            if not agent.get("observation") and step.observations:
                agent["observation"] = {"results": [_recorded(obs, _call_ids(agent)) for obs in step.observations]}
        for number, atif in enumerate(self.out, start=1):
            atif["step_id"] = number
        return [{key: atif[key] for key in sorted(atif, key=ORDER.index)} for atif in self.out]

    def _emit(self, atif: dict[str, Any], step: Step | None = None) -> dict[str, Any]:
        self.out.append(atif)
        self.recorded_out = self.recorded_out or step is not None
        return atif

    def _context(self, start: int, end: int) -> None:
        """The conversation's messages in ``[start, end)``, none of them a recorded reply."""
        for message in self.messages[start:end]:
            role = str(message.get("role") or "")
            if role == "assistant":
                copied = self._emit(_copied_agent(message))
                self.holder = copied if self.holder is not None else None
                self.opening_call = copied if self.holder is None else None
            elif self.holder is not None or self._answers_opening_call(message):
                holder = self.holder or self.opening_call
                ids = _call_ids(holder)
                call_id = message.get("tool_call_id")
                result = {"source_call_id": call_id if call_id in ids else None, "content": message_text(message),
                          "extra": {"role": role}}
                holder.setdefault("observation", {"results": []})["results"].append(_compact(result))
            else:
                atif = {"step_id": 0, "source": "system" if role in SYSTEM_ROLES else "user",
                        "message": message_text(message)}
                if role not in ("system", "user"):
                    atif["extra"] = {"role": role}
                if self.recorded_out:
                    atif["is_copied_context"] = True
                self._emit(atif)

    def _answers_opening_call(self, message: Message) -> bool:
        """A tool message answering a call of a copied turn in the prompt (a few-shot tool call) is its result."""
        return self.opening_call is not None and message.get("tool_call_id") in _call_ids(self.opening_call)

    def _agent(self, step: Step, shown: bool) -> dict[str, Any]:
        atif = _agent_message(step.message, step.index)
        if step.started_at:
            atif["timestamp"] = datetime.fromtimestamp(step.started_at, tz=timezone.utc).isoformat()
        atif["metrics"] = _metrics(step)
        atif["llm_call_count"] = 1
        extra: dict[str, Any] = {"turn": step.index, "finish_reason": step.finish_reason,
                                 "model_seconds": step.model_seconds, "env_seconds": step.env_seconds}
        if step.format_error is not None:
            extra["format_error"] = step.format_error
        if step.termination_reason is not None:
            extra["exit_reason"] = step.termination_reason.value
        if step.actions and "tool_calls" not in atif:
            extra["actions"] = [a.model_dump(mode="json", exclude={"raw"}) for a in step.actions]
        if step.index in self.breaks:
            extra["token_break"] = self.breaks[step.index]
        atif["extra"] = _compact(extra)
        if not shown and step.observations:
            atif["observation"] = {"results": [_recorded(obs, _call_ids(atif)) for obs in step.observations]}
        return atif


def _positions(messages: list[Message], steps: list[Step]) -> dict[int, int]:
    """Step index -> the position of its reply in ``messages`` (a step not found has none). Matched from the end:
    the conversation is the latest one, so it holds the latest replies (an earlier conversation's reply with the
    same text is not mistaken for one of them)."""
    keys = [_canon(m) if m.get("role") == "assistant" else None for m in messages]
    found: dict[int, int] = {}
    end = len(keys)
    for index in range(len(steps) - 1, -1, -1):
        key = _canon(steps[index].message)
        at = next((j for j in range(end - 1, -1, -1) if keys[j] == key), None)
        if at is not None:
            found[index], end = at, at
    return found


def _canon(message: Message) -> tuple[Any, ...]:
    """What two assistant messages share when they are the same reply (a client may re-send it re-serialised)."""
    calls = []
    for call in message.get("tool_calls") or []:
        call = call if isinstance(call, dict) else {}
        function = call.get("function") or {}
        calls.append((call.get("id") or "", function.get("name") or "", _normal_json(function.get("arguments"))))
    return message_text(message), tuple(calls)


def _normal_json(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True)


def _agent_message(message: Message, turn: int) -> dict[str, Any]:
    atif: dict[str, Any] = {"step_id": 0, "source": "agent", "message": message_text(message)}
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        atif["reasoning_content"] = reasoning
    calls = [_tool_call(call, turn, n) for n, call in enumerate(message.get("tool_calls") or [], start=1)
             if isinstance(call, dict)]
    if calls:
        atif["tool_calls"] = calls
    return atif


def _copied_agent(message: Message) -> dict[str, Any]:
    atif = _agent_message(message, 0)
    atif["is_copied_context"] = True
    return atif


def _tool_call(call: dict[str, Any], turn: int, number: int) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry as an ATIF tool call: arguments decoded to an object; arguments that are not
    one (invalid JSON: the step's format error) are kept as text in ``extra.raw_arguments``."""
    function = call.get("function") or {}
    raw = function.get("arguments")
    arguments: Any = raw
    if isinstance(raw, str):
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except ValueError:
            arguments = None
    atif = {"tool_call_id": str(call.get("id") or f"call_{turn}_{number}"),
            "function_name": str(function.get("name") or ""),
            "arguments": arguments if isinstance(arguments, dict) else {}}
    if not isinstance(arguments, dict):
        atif["extra"] = {"raw_arguments": raw if isinstance(raw, str) else json.dumps(raw)}
    return atif


def _call_ids(atif: dict[str, Any]) -> set[str]:
    return {call["tool_call_id"] for call in atif.get("tool_calls") or []}


def _recorded(obs: Observation, call_ids: set[str]) -> dict[str, Any]:
    """A recorded observation the model was not shown (its step ended the episode, or the conversation is lost)."""
    extra = {"shown_to_model": False, "action": obs.action_name, "success": obs.success,
             "info": obs.model_dump(mode="json")["info"]}
    if obs.reward is not None:
        extra["reward"] = obs.reward
    return _compact({"source_call_id": obs.call_id if obs.call_id in call_ids else None, "content": obs.content,
                     "extra": extra})


def _metrics(step: Step) -> dict[str, Any]:
    """Usage and the run's own token data, as recorded (never re-tokenized)."""
    metrics: dict[str, Any] = {"prompt_tokens": step.usage.prompt_tokens,
                               "completion_tokens": step.usage.completion_tokens,
                               "prompt_token_ids": step.prompt_token_ids,
                               "completion_token_ids": step.completion_token_ids,
                               "logprobs": step.logprobs}
    if step.policy_version is not None:
        metrics["extra"] = {"policy_version": step.policy_version}
    return _compact(metrics)


def _compact(fields: dict[str, Any]) -> dict[str, Any]:
    """Without the None values (ATIF writers leave unknown fields out)."""
    return {key: value for key, value in fields.items() if value is not None}
