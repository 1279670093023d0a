"""A scripted policy for function-calling tasks over a resources server: it plays the calculator task family
(``envs.resources.calc_server``) the way a good model would, and misbehaves on request so every termination and
error row of the agent server can be exercised end to end.

``calculator``: turn 1 calls the ``calculator`` tool on the expression of the first user message ("Compute <e>.");
after the tool's output it answers "The result is <the output's last number>." (no tool calls: the episode ends).
A tag in the user message makes it misbehave instead: ``[loop]`` calls the tool forever (``max_steps``),
``[long]`` is cut at the output limit (``finish_reason: length``), ``[bad-args]`` sends arguments that are not
JSON on its first call, ``[unknown-tool]`` calls a tool nobody offered first, ``[wrong]`` answers off by one.
``guesser`` plays the guess-the-number game (``envs.resources.text_game``); ``tool_user`` picks one of the two by
the tools offered.
"""

from __future__ import annotations

import json
import re

from rollout.context import message_text
from rollout.models.scripted import Output, PolicyContext
from rollout.records import Message

EXPRESSION = re.compile(r"Compute (.+?)\.(?:\s|$)")


def _call(name: str, arguments: object, turn: int) -> Output:
    return {"content": None, "tool_calls": [{"id": f"call_{turn}", "name": name, "arguments": arguments}]}


def _result(output: str) -> float | None:
    """The number a tool answered (``{"result": n}``), or None for an error or anything else."""
    try:
        value = json.loads(output).get("result")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except (ValueError, AttributeError):
        return None


def calculator(messages: list[Message], ctx: PolicyContext) -> Output:
    first = next((message_text(m) for m in messages if m.get("role") == "user"), "")
    turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    match = EXPRESSION.search(first)
    expression = match.group(1) if match else first
    if "[long]" in first:
        return {"content": "Let me think about this at length " + "and more " * 50, "finish_reason": "length"}
    if "[loop]" in first:
        return _call("calculator", json.dumps({"expression": expression}), turn)
    if turn == 1 and "[bad-args]" in first:
        return _call("calculator", '{"expression": ', turn)
    if turn == 1 and "[unknown-tool]" in first:
        return _call("abacus", json.dumps({"expression": expression}), turn)
    last = messages[-1] if messages else {}
    result = _result(message_text(last)) if last.get("role") == "tool" else None
    if result is not None:
        value = result + (1 if "[wrong]" in first else 0)
        shown = int(value) if value == int(value) else value
        return f"The calculator says so. The result is {shown}."
    if turn > 4:
        return "I could not compute it."
    return _call("calculator", json.dumps({"expression": expression}), turn)


def guesser(messages: list[Message], ctx: PolicyContext) -> Output:
    """Plays a guess-the-number game with a ``guess`` tool answering higher/lower/correct (the Aviary text game,
    ``envs.resources.text_game``): a binary search over [1, 100] rebuilt from the conversation each turn."""
    low, high, guesses = 1, 100, {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            try:
                guesses[call.get("id")] = int(json.loads(call["function"]["arguments"]).get("number"))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        if message.get("role") == "tool" and message.get("tool_call_id") in guesses:
            said, number = message_text(message).lower(), guesses[message.get("tool_call_id")]
            if said.startswith("correct"):
                return f"Found it: {number}."
            if said.startswith("higher"):
                low = max(low, number + 1)
            elif said.startswith("lower"):
                high = min(high, number - 1)
    turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    return _call("guess", json.dumps({"number": (low + high) // 2}), turn)


def tool_user(messages: list[Message], ctx: PolicyContext) -> Output:
    """``guesser`` when a ``guess`` tool is offered, else ``calculator``: one served policy for an agent server
    that hosts both example environments."""
    names = {(t.get("function") or t).get("name") for t in ctx.tools or [] if isinstance(t, dict)}
    return guesser(messages, ctx) if "guess" in names else calculator(messages, ctx)
