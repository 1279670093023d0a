"""A finished conversation as Responses API ``output`` items (what a NeMo-Gym verifier reads and what NeMo RL
trains on): every message from the first assistant turn on, in order.

- an assistant turn → a ``message`` item (when it has text) and one ``function_call`` item per tool call, each
  carrying the turn's token data as NeMo RL reads it (``prompt_token_ids``, ``generation_token_ids``,
  ``generation_log_probs``) when the engine returned it;
- a ``role: tool`` message → a ``function_call_output`` item;
- a user message inside the episode (an observation, a corrective message) → an input-style ``message`` item.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Mapping, Sequence

from rollout.records import RolloutResult, Step


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def token_fields(step: Step) -> dict[str, Any]:
    """The NeMo RL token fields of one recorded step (empty without the engine's ids)."""
    prompt, generated = step.prompt_token_ids, step.completion_token_ids
    if prompt is None or generated is None:
        return {}
    return {"prompt_token_ids": list(prompt), "generation_token_ids": list(generated),
            "generation_log_probs": [float(x) for x in (step.logprobs or [])]}


def assistant_items(message: Mapping[str, Any], tokens: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """One assistant turn as ``message`` + ``function_call`` items."""
    out: list[dict[str, Any]] = []
    text = _text(message.get("content"))
    if text:
        out.append({"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}], **tokens})
    for j, call in enumerate(message.get("tool_calls") or []):
        if not isinstance(call, Mapping):
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments")
        out.append({"type": "function_call", "id": f"fc_{index}_{j}", "call_id": str(call.get("id") or ""),
                    "name": str(function.get("name", "")),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
                    "status": "completed", **tokens})
    return out


def trajectory_output(messages: Sequence[Mapping[str, Any]], steps: Iterable[Step] = ()) -> list[dict[str, Any]]:
    """The output items of a conversation: from its first assistant message on. ``steps``: the recorded turns,
    one per assistant message in order (``rollout.records.Step``), whose token data go on that turn's items."""
    steps = list(steps)
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    out: list[dict[str, Any]] = []
    turn = 0
    for i, message in enumerate(messages[first:], start=first):
        role = message.get("role")
        if role == "assistant":
            tokens = token_fields(steps[turn]) if turn < len(steps) else {}
            out.extend(assistant_items(message, tokens, i))
            turn += 1
        elif role == "tool":
            out.append({"type": "function_call_output", "id": f"fco_{i}",
                        "call_id": str(message.get("tool_call_id") or ""), "output": _text(message.get("content")),
                        "status": "completed"})
        else:
            out.append({"type": "message", "id": f"msg_{i}", "role": "user" if role != "system" else "system",
                        "status": "completed",
                        "content": [{"type": "input_text", "text": _text(message.get("content"))}]})
    return out


ECHOED = ("instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
          "parallel_tool_calls", "metadata")
"""Request fields a Responses object repeats."""


def response_envelope(params: Mapping[str, Any], output: list[dict[str, Any]], *, model: str | None, usage: Any,
                      truncated: bool, response_id: str, created_at: int) -> dict[str, Any]:
    """A Responses object around ``output``: status, ``incomplete_details``, usage (prompt, completion, total as
    ``input_tokens``/``output_tokens``/``total_tokens``), and the request fields it repeats."""
    prompt, completion, total = (usage or (0, 0, 0))
    reply: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": created_at,
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "output": output,
        "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": total},
        "error": None,
    }
    reply.update({name: params.get(name) for name in ECHOED})
    reply["tools"] = list(params.get("tools") or [])
    reply["tool_choice"] = params.get("tool_choice") or "auto"
    reply["parallel_tool_calls"] = bool(params.get("parallel_tool_calls", True))
    reply["model"] = model or params.get("model") or ""
    return reply


def result_response(result: RolloutResult, params: Mapping[str, Any]) -> dict[str, Any]:
    """A finished rollout (``rollout.records.RolloutResult``) as the Responses object of the request ``params``:
    its conversation from the first model turn on, the engine's token data, ``incomplete`` when the last turn was
    cut at the output limit."""
    traj, usage = result.trajectory, result.usage
    steps = traj.steps
    truncated = bool(steps) and steps[-1].finish_reason == "length"
    return response_envelope(params, trajectory_output(traj.messages, steps), model=params.get("model"),
                             usage=(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
                             truncated=truncated, response_id=f"resp_{result.rollout_id}",
                             created_at=int(time.time()))
