"""A synthetic tool task family with graded difficulty and a verifiable reward, for a tiny model to learn.

Levels (every task offers the same two tools, so every prompt shares one system block):

1. ``What is 3 + 4?`` — one-digit operands, ``+`` or ``-``: one ``calculator`` call, then the answer.
2. ``What is 42 - 17?`` — two-digit operands, ``+`` or ``-``.
3. ``What is 23 * 7?`` — a two-digit times a one-digit number.
4. ``What do 3 units of "pear" cost?`` — ``lookup`` the unit price in the task's own price table, then
   ``calculator`` the product: two tool rounds, the second built from the first's result.

The reward is 1.0 when the last number of the final assistant message (one without tool calls, after any
``<tool_call>`` block in its text is cut out) equals the answer, else 0.0: an answer that appears only in a tool
call or a tool's output does not count. ``make_tasks(n, seed, split)`` draws rows from one of two disjoint
splits (``train``, ``heldout``): a problem's split is a hash of the problem, so no held-out problem is ever
trained on. In a run config::

    environment: {type: tool, tools: "examples.rl_cpu.tasks:tools_for", reward: "examples.rl_cpu.tasks:reward"}
    agent: {type: tool_calling, max_steps: 4}        # no system prompt: the template's tool block is the prompt
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

from agents.tools.registry import ToolRegistry
from agents.tools.tool import FunctionTool, ToolParameter
from rollout.context import message_text
from rollout.records import Message, RolloutResult, Task

SPLITS = ("train", "heldout")
LEVELS = (1, 2, 3, 4)
HELDOUT_SHARE = 5
"""One problem in about this many is held out."""
ITEMS = ("apple", "pear", "plum", "fig", "lime", "kiwi", "peach", "grape")
OPS = {"+": ("add", lambda a, b: a + b), "-": ("sub", lambda a, b: a - b), "*": ("mul", lambda a, b: a * b)}
NUMBER = re.compile(r"-?\d+")
TOOL_CALL_TEXT = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def calculator(a: int, op: str, b: int) -> int:
    """Compute a op b for integers a and b."""
    return OPS[op][1](a, b)


def tools_for(task: Task) -> ToolRegistry:
    """The task's tools: ``calculator`` and ``lookup`` over the task's own price table (empty below level 4)."""
    table = dict((task.data or {}).get("table") or {})

    def lookup(item: str) -> int:
        """Look up the unit price of an item."""
        if item not in table:
            raise KeyError(f"no price for {item!r}")
        return table[item]

    return ToolRegistry([
        FunctionTool(calculator, [ToolParameter("a", "integer"), ToolParameter("op", "string", enum=list(OPS)),
                                  ToolParameter("b", "integer")]),
        FunctionTool(lookup, [ToolParameter("item", "string")]),
    ])


def tool_schemas() -> list[dict[str, Any]]:
    """The tools as the model sees them (the same for every task)."""
    return tools_for(Task(task_id="schemas")).schemas()


def final_answer(messages: list[Message]) -> int | None:
    """The last number of the final assistant message, or None: the conversation must end on an assistant
    message without tool calls, and tool-call text inside it does not count."""
    if not messages or messages[-1].get("role") != "assistant" or messages[-1].get("tool_calls"):
        return None
    numbers = NUMBER.findall(TOOL_CALL_TEXT.sub(" ", message_text(messages[-1])))
    return int(numbers[-1]) if numbers else None


def score(task: Task | dict[str, Any], messages: list[Message]) -> float:
    data = task.data if isinstance(task, Task) else task.get("data", {})
    given = final_answer(messages)
    return 1.0 if given is not None and given == data["answer"] else 0.0


def reward(task: Task, result: RolloutResult) -> float:
    """1.0 when the final message's last number is the answer, else 0.0."""
    return score(task, result.trajectory.messages)


def split_of(key: str) -> str:
    """A problem's split, from a hash of the problem (stable across processes and Python versions)."""
    return SPLITS[int(hashlib.sha256(key.encode()).hexdigest(), 16) % HELDOUT_SHARE == 0]


def problem_key(row: dict[str, Any]) -> str:
    """What makes a problem itself (its split is a hash of this): the level and the solution's arguments."""
    data = row["data"]
    if data["level"] == 4:
        (_, lookup), (_, mul) = data["solution"]
        return f"4:{mul['a']}:{lookup['item']}:{mul['b']}"
    (_, args), = data["solution"]
    return f"{data['level']}:{args['a']}{args['op']}{args['b']}"


def problem(rng: random.Random, level: int) -> dict[str, Any]:
    """One random problem of a level: its key, prompt, answer and the tool calls that solve it."""
    if level == 4:
        items = rng.sample(ITEMS, 3)
        table = {item: rng.randint(2, 19) for item in items}
        item, qty = items[0], rng.randint(2, 9)
        return {"slug": f"cost-{qty}-{item}-{table[item]}",
                "prompt": f'What do {qty} units of "{item}" cost?', "answer": qty * table[item], "table": table,
                "calls": [("lookup", {"item": item}), ("calculator", {"a": qty, "op": "*", "b": table[item]})]}
    if level == 3:
        a, op, b = rng.randint(10, 99), "*", rng.randint(2, 9)
    else:
        low, high = (0, 9) if level == 1 else (10, 99)
        a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
    return {"slug": f"{OPS[op][0]}-{a}-{b}", "prompt": f"What is {a} {op} {b}?",
            "answer": calculator(a, op, b), "calls": [("calculator", {"a": a, "op": op, "b": b})]}


def make_tasks(n: int, seed: int = 0, split: str = "train", levels: tuple[int, ...] = LEVELS,
               unique: bool = True) -> list[dict[str, Any]]:
    """``n`` dataset rows (``task_id``, ``prompt``, ``data``: answer, level, split, solution, table) of one split,
    levels in turn. ``unique``: no problem twice (a level whose split runs out of problems is skipped)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng, rows, seen = random.Random(f"{seed}:{split}"), [], set()
    exhausted: set[int] = set()
    while len(rows) < n and len(exhausted) < len(levels):
        level = levels[len(rows) % len(levels)] if not exhausted else rng.choice(
            [lv for lv in levels if lv not in exhausted])
        for _ in range(2000):
            p = problem(rng, level)
            data = {"answer": p["answer"], "level": level, "split": split, "solution": [list(c) for c in p["calls"]]}
            key = problem_key({"data": data})
            if split_of(key) == split and not (unique and key in seen):
                break
        else:
            exhausted.add(level)
            continue
        seen.add(key)
        if "table" in p:
            data["table"] = p["table"]
        rows.append({"task_id": f"{split}-{len(rows)}-{p['slug']}", "prompt": p["prompt"], "data": data})
    return rows


def as_task(row: dict[str, Any]) -> Task:
    return Task(task_id=row["task_id"], prompt=row["prompt"], data=row.get("data") or {})


def call_message(name: str, arguments: dict[str, Any], n: int = 0) -> Message:
    """An assistant message with one tool call, as the client parses it from a completion."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
