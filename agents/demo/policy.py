"""The scripted policy that plays every demo task (served by the fake server, or in process).

It reads the task (looked up by the request's task id) and the conversation so far. The tool
tasks really use earlier results: the course task searches for the lesson title it read in the
first tool result, and the guessing game bisects on the hints it got back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollout.errors import SUBMIT_SENTINEL


def demo_policy(messages: list[dict[str, Any]], ctx) -> str | dict[str, Any]:
    task = ctx.task
    if task is None:
        return "I have no task to work on."
    kind = task.data.get("kind")
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if kind == "shell":
        return shell(task.data, turn)
    if kind == "course_topic":
        return course_topic(task.data, messages, turn)
    if kind == "calculator":
        return calculator(task.data, messages, turn)
    if kind == "guess_number":
        return guess_number(task.data, messages)
    return f"I do not know how to do tasks of kind {kind!r}."


def shell(data: dict[str, Any], turn: int) -> str:
    """Runs ``data.solution`` one command per turn, then submits; may open with a format slip."""
    steps = list(data.get("solution", []))
    if data.get("format_error_first"):
        if turn == 0:
            return "I will start by looking at the directory, with ls."  # no bash block: fed back
        turn -= 1
    if turn < len(steps):
        return f"Next step.\n\n```bash\n{steps[turn]}\n```"
    show = data.get("submit", "true")
    return f"Done; submitting.\n\n```bash\necho {SUBMIT_SENTINEL} && {show}\n```"


def last_tool_result(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "tool":
            return m.get("content") or ""
    return ""


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"name": name, "arguments": arguments}]}


def course_topic(data: dict[str, Any], messages: list[dict[str, Any]], turn: int) -> str | dict[str, Any]:
    course, lesson = data["course"], int(data["lesson"])
    if turn == 0:
        return call("get_course_outline", course_title=course)
    if turn == 1:
        found = re.search(rf"^Lesson {lesson}: (.+)$", last_tool_result(messages), re.M)
        if not found:
            return f"The outline has no lesson {lesson}."
        return call("search_course_content", query=found.group(1).strip(), exclude_course=course)
    hit = re.search(r"^Course: (.+?) \| Lesson \d+: (.+)$", last_tool_result(messages), re.M)
    if not hit:
        return "No other course covers that topic."
    return f"The course {hit.group(1)} also covers '{hit.group(2)}'."


def calculator(data: dict[str, Any], messages: list[dict[str, Any]], turn: int) -> str | dict[str, Any]:
    if turn == 0:
        return call("calculate", expression=data["expression"])
    return f"The answer is {last_tool_result(messages).strip()}."


def guess_number(data: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """Bisects on the environment's "higher"/"lower" hints, in ReAct format."""
    lo, hi = 1, int(data.get("high", 10))
    for m in messages:
        hint = re.search(r"(\d+) is wrong; the number is (higher|lower)", str(m.get("content") or ""))
        if m.get("role") == "user" and hint:
            guessed = int(hint.group(1))
            lo, hi = (guessed + 1, hi) if hint.group(2) == "higher" else (lo, guessed - 1)
    if any(m.get("role") == "user" and " is right!" in str(m.get("content")) for m in messages):
        return "Thought: I found it.\nFinal Answer: done"
    mid = (lo + hi) // 2
    return f"Thought: the number is between {lo} and {hi}.\nAction: guess\nAction Input: {json.dumps({'number': mid})}"
