"""The messages of a mini-swe-agent ``.traj.json``: the rollout's conversation with the ``extra`` mini-swe-agent 2.4.6
gives each message (a reply's actions, raw response and timestamp; an observation's output and return code; a
format error's interrupt type)."""

from __future__ import annotations

from typing import Any

from rollout.records import Action, Message, Observation, Step, Trajectory


def messages_with_extra(trajectory: Trajectory) -> list[Message]:
    """The conversation, each message a copy with a string ``content`` and, when a step recorded it, the
    ``extra`` mini-swe-agent gives it. A step's reply is found by equality; the messages after it until the
    next reply are its observations (by tool call id, else in order) or its format error's feedback."""
    replies: dict[int, Step] = {}
    steps = trajectory.steps
    for i, message in enumerate(trajectory.messages):
        if len(replies) < len(steps) and message == steps[len(replies)].message:
            replies[i] = steps[len(replies)]
    out: list[Message] = []
    step: Step | None = None
    after = 0
    for i, message in enumerate(trajectory.messages):
        copy = _message(message)
        extra: dict[str, Any] | None = None
        if i in replies:
            step, after = replies[i], 0
            extra = _reply_extra(step)
        elif step is not None:
            extra = _follower_extra(step, after, copy)
            after += 1
        if extra is not None:
            copy["extra"] = {**extra, **(copy.get("extra") or {})}
        out.append(copy)
    return out


def _reply_extra(step: Step) -> dict[str, Any]:
    return {"actions": [_action(a) for a in step.actions], "response": model_response(step), "cost": 0.0,
            "timestamp": _reply_time(step), "finish_reason": step.finish_reason, "usage": step.usage.model_dump()}


def model_response(step: Step) -> dict[str, Any]:
    """The reply as the chat completion the endpoint returned (mini-swe-agent keeps the provider's response here),
    rebuilt from what the step recorded: the message, finish reason, usage, and the completion's token ids when
    the engine returned them (``choices[0].token_ids``, as vLLM names them). The provider's id is not recorded;
    the prompt's token ids and the logprobs stay in the rollout's own trajectory file."""
    message = {k: v for k, v in step.message.items() if k != "extra"}
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": step.finish_reason}
    if step.completion_token_ids is not None:
        choice["token_ids"] = list(step.completion_token_ids)
    return {"object": "chat.completion", "created": int(_reply_time(step)), "choices": [choice],
            "usage": step.usage.model_dump()}


def _follower_extra(step: Step, index: int, message: Message) -> dict[str, Any] | None:
    if step.format_error is not None:
        return {"interrupt_type": "FormatError", "model_response": _message(step.message)["content"]}
    times = _observation_times(step)
    call_id = message.get("tool_call_id")
    for j, obs in enumerate(step.observations):
        if call_id is not None and obs.call_id == call_id:
            return _observation_extra(obs, times[j])
    if index < len(step.observations):
        return _observation_extra(step.observations[index], times[index])
    return None


def _action(action: Action) -> dict[str, Any]:
    command = action.arguments.get("command")
    out: dict[str, Any] = {"command": command} if isinstance(command, str) else {
        "name": action.name, "arguments": action.arguments}
    if action.call_id is not None:
        out["tool_call_id"] = action.call_id
    return out


def _observation_extra(obs: Observation, timestamp: float) -> dict[str, Any]:
    """What mini-swe-agent keeps of a command's run, from what our environment recorded in ``info``."""
    info = obs.info
    timed_out = bool(info.get("timed_out"))
    returncode = info.get("returncode")
    if returncode is None:
        returncode = -1 if timed_out else 0 if obs.success else 1
    exception = ""
    if timed_out:
        limit = info.get("timeout")
        exception = "the command timed out" + (f" after {limit:g} seconds" if isinstance(limit, (int, float)) else "")
    rest = {k: v for k, v in info.items() if k not in ("returncode", "command")}
    return {"raw_output": obs.content, "returncode": returncode, "timestamp": timestamp, "exception_info": exception,
            **rest}


def _reply_time(step: Step) -> float:
    """When the reply arrived: the model call's start plus its duration."""
    return step.started_at + step.model_seconds


def _observation_times(step: Step) -> list[float]:
    """When each action finished: after the reply, one duration after another (the step's time split evenly
    when an observation has none)."""
    now, share = _reply_time(step), step.env_seconds / max(1, len(step.observations))
    times = []
    for obs in step.observations:
        duration = obs.info.get("duration")
        now += float(duration) if isinstance(duration, (int, float)) else share
        times.append(now)
    return times


def _message(message: Message) -> Message:
    """A copy whose content is a string: text parts joined, none as ""."""
    out = dict(message)
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        out["content"] = "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return out
