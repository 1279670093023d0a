"""The OpenAI Responses API in terms of chat completions, both ways: what a NeMo-Gym-style agent server speaks
(``/v1/responses``, ``responses_create_params`` rows) to a chat-completions engine (vLLM, the scripted apps).

- ``chat_request(params)``: a Responses create request → a chat-completions body. ``input`` as a string or items
  (messages with string or ``input_text``/``output_text`` parts, ``function_call``, ``function_call_output``);
  ``instructions`` → a system message; flat Responses tools → nested chat tools; ``max_output_tokens`` →
  ``max_tokens``; ``tool_choice`` by name → chat's nested form.
- ``response_object(completion, params)``: a chat completion → a Responses object: the text as a ``message`` item,
  each tool call as a ``function_call`` item, ``finish_reason: length`` → ``status: incomplete`` with
  ``incomplete_details.reason: max_output_tokens``; the engine's token data on each output item as NeMo RL reads
  it (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any, Mapping

from rollout.errors import ConfigError
from rollout.wire.responses_items import response_envelope

PASSED_THROUGH = ("model", "temperature", "top_p", "parallel_tool_calls", "seed", "stop", "metadata", "user")
"""Request fields that mean the same in both APIs."""
_ids = itertools.count(1)


class ResponsesFormatError(ConfigError, ValueError):
    """The request is not a Responses create request this conversion understands (a bad request, as a
    ``ConfigError``; the message says where)."""


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text", "text"):
                parts.append(str(part.get("text", "")))
            else:
                raise ResponsesFormatError(f"{where}.content[{i}]: only text parts are supported")
        return "".join(parts)
    raise ResponsesFormatError(f"{where}.content: a string or a list of text parts")


def chat_messages(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conversation a Responses request describes, as chat messages."""
    messages: list[dict[str, Any]] = []
    if params.get("instructions"):
        messages.append({"role": "system", "content": str(params["instructions"])})
    items = params.get("input", [])
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ResponsesFormatError("input: a string or a list of items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise ResponsesFormatError(f"{where}: an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ResponsesFormatError(f"{where}.role: user, assistant, system or developer, not {role!r}")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments") or "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # one assistant turn: its text and its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                             "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # the engine's own reasoning is not sent back
        else:
            raise ResponsesFormatError(f"{where}.type: message, function_call or function_call_output, not {kind!r}")
    return messages


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Flat Responses function tools → nested chat tools."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not tool.get("name"):
            raise ResponsesFormatError(f"tools[{i}]: a function tool with a name")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def chat_request(params: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses create request as a chat-completions body."""
    body: dict[str, Any] = {"messages": chat_messages(params)}
    for name in PASSED_THROUGH:
        if params.get(name) is not None:
            body[name] = params[name]
    if params.get("max_output_tokens") is not None:
        body["max_tokens"] = params["max_output_tokens"]
    tools = chat_tools(params.get("tools"))
    if tools:
        body["tools"] = tools
        choice = params.get("tool_choice")
        if isinstance(choice, Mapping) and choice.get("type") == "function":
            body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice is not None:
            body["tool_choice"] = choice
    return body


def response_object(completion: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion (with vLLM's optional token ids and logprobs) as a Responses object."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{next(_ids)}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append({"type": "function_call", "id": f"fc_{next(_ids)}", "call_id": call.get("id") or "",
                       "name": function.get("name", ""), "arguments": function.get("arguments") or "{}",
                       "status": "completed"})
    tokens = _token_fields(completion, choice)
    for item in output:
        item.update(tokens)
    usage = completion.get("usage") or {}
    counts = (usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), usage.get("total_tokens", 0))
    return response_envelope(params, output, model=completion.get("model"), usage=counts,
                             truncated=choice.get("finish_reason") == "length", response_id=f"resp_{next(_ids)}",
                             created_at=int(time.time()))


def _token_fields(completion: Mapping[str, Any], choice: Mapping[str, Any]) -> dict[str, Any]:
    prompt, generated = completion.get("prompt_token_ids"), choice.get("token_ids")
    if prompt is None or generated is None:
        return {}
    logprobs = [float(x["logprob"]) for x in ((choice.get("logprobs") or {}).get("content") or [])]
    return {"prompt_token_ids": list(prompt), "generation_token_ids": list(generated),
            "generation_log_probs": logprobs}
