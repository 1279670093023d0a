"""A scripted policy for the RL example's tool tasks (``examples.rl_cpu.tasks``), for trainer integrations that need
real multi-turn tool rollouts without a trained model: in a run config, ``serve: {app: scripted, policy:
"examples.tool_solver:tool_solver"}`` with ``model: {type: openai, return_token_ids: true, logprobs: true}``, and the
scripted server returns the token ids and logprobs of every turn as an engine does.

An even seed plays the task's own solution (``data["solution"]``: one tool call a turn), then answers with the last
tool's output (reward 1.0); an odd seed guesses at once, one too many (reward 0.0). A group of n members with the
farm's consecutive seeds is therefore half right, half wrong: GRPO's advantages are not all zero.
"""

from __future__ import annotations

from rollout.context import message_text
from rollout.models.scripted import Output, PolicyContext
from rollout.records import Message

TOOL_TASKS = {
    "model": {"type": "openai", "model": "scripted", "return_token_ids": True, "logprobs": True},
    "serve": {"app": "scripted", "in_process": True, "policy": "examples.tool_solver:tool_solver"},
    "agent": {"type": "tool_calling", "max_steps": 4},
    "environment": {"type": "tool", "tools": "examples.rl_cpu.tasks:tools_for",
                    "reward": "examples.rl_cpu.tasks:reward"},
    "farm": {"backend": "local"},
}
"""The RL example's farm (``examples/rl_cpu/loop.py``) with this solver, played in process, in place of the trained
policy (one process, no Ray)."""


def tool_solver(messages: list[Message], ctx: PolicyContext) -> Output:
    if ctx.task is None:
        return f"I was not given task {ctx.meta.task_id!r}."
    data = ctx.task.data
    if (ctx.meta.seed or 0) % 2:
        return f"I would guess {data['answer'] + 1}."
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    calls = data.get("solution") or []
    if turn < len(calls):
        name, arguments = calls[turn]
        return {"tool_calls": [{"name": name, "arguments": arguments}]}
    last = next((m for m in reversed(messages) if m.get("role") == "tool"), None)
    return f"The answer is {message_text(last) if last else '?'}."
