"""Built-in scripted policies, usable by name (``policy: echo``) from a scripted model or the scripted server."""

from __future__ import annotations

from rollout.context import message_text
from rollout.errors import SUBMIT_SENTINEL
from rollout.models.scripted import Output, PolicyContext
from rollout.records import Message


def echo(messages: list[Message], ctx: PolicyContext) -> Output:
    """Echo the last user or tool message as plain text: no tool calls, so a natural completion."""
    last = next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), None)
    return "echo: " + (message_text(last) if last else "")


def bash_echo(messages: list[Message], ctx: PolicyContext) -> Output:
    """Mini-SWE style, three turns: ``echo step 1``, ``echo step 2``, then submit."""
    turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    if turn < 3:
        return f"Turn {turn}.\n```bash\necho step {turn}\n```"
    return f"Done.\n```bash\necho {SUBMIT_SENTINEL}\n```"


def oracle(messages: list[Message], ctx: PolicyContext) -> Output:
    """Answer with the task's ``data["answer"]`` (the task is looked up by the request's task id)."""
    if ctx.task is None:
        return f"unknown task {ctx.meta.task_id!r}"
    return str(ctx.task.data.get("answer", ""))


def seed_writer(messages: list[Message], ctx: PolicyContext) -> Output:
    """Mini-SWE style, two turns whose effect depends on the sample's seed: write the request's seed to
    ``seed.txt`` (after sleeping the task's ``data["pause"]`` seconds, if any), then submit. A task's check
    command can pay by seed, so a group's rewards are known in advance (trainer tests, demos of GRPO groups)."""
    turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    if turn == 1:
        pause = float(ctx.task.data.get("pause", 0)) if ctx.task is not None else 0.0
        sleep = f"sleep {pause:g} && " if pause > 0 else ""
        return f"Recording my seed.\n```bash\n{sleep}echo {ctx.meta.seed} > seed.txt\n```"
    return f"Done.\n```bash\necho {SUBMIT_SENTINEL}\n```"
