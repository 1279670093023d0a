"""Scripted SWE policies for the Mini-SWE bash loop: ``gold`` (the reference patch), ``empty``, ``replay``.

Each reply holds one command, in the form the request asks for, as a model would answer it: a call of the ``bash``
tool when the request offers a function tool of that name with a string ``command`` parameter (mini-swe-agent's
default config), otherwise a fenced block after a line of thought. The block's fence is the one the prompt's own
examples use (the system message's code blocks, else the first user message's, when they all name one language:
```mswea_bash_command for mini-swe-agent's text-based config), and ```bash when the prompt shows none or several.
The turn is counted from the assistant messages so far. They need the task (``ScriptedModel(tasks=...)``, which
the composition passes): its SWE fields are in ``task.data``.

``replay`` plays back the shell commands of a stored trajectory, one per turn, in order. The
trajectory comes from ``task.data["replay_trajectory"]``, which names either

- a trajectory file as ``rollout.store.run_dir`` writes it (``{"trajectory": {"steps": [{"actions":
  [{"arguments": {"command": ...}}]}]}}``; a bare ``{"steps": ...}`` works too), or
- a run directory: the trajectory of the last ``results.jsonl`` line with this task id and the
  request's ``sample_index`` (so sample *k* replays sample *k*).

``replay_from(source)`` builds the same policy from a config-level source instead: a run directory, or a
mapping ``{task_id: trajectory file or run directory}``. Relative paths are taken from the current
directory. Only actions with a string ``command`` argument are replayed (bash actions, and tool calls
such as ``bash(command=...)``); steps without one (format errors) are skipped. In a text reply, a command
that would break the fence is sent as ``eval "$(echo <base64> | base64 -d)"``. When the commands run out
before the episode ends (the recording ended on a limit, not a submission), the model call fails with a
non-retryable ``ModelError``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.context import message_text
from rollout.errors import ModelError
from rollout.models.policies import SUBMIT_SENTINEL
from rollout.models.scripted import Output, Policy, PolicyContext
from rollout.records import Message

SUBMIT_COMMAND = f"echo {SUBMIT_SENTINEL} && git add -A && git diff --cached"
"""Stage everything and print the staged diff after the sentinel line: the Mini-SWE submission."""
_UNSAFE = ("```", "<think>", "</think>")
"""Text that would end the bash block early or be dropped as reasoning by the parser."""
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_.+-]+)[ \t]*$", re.MULTILINE)
"""The opening line of a fenced block that names its language."""
DEFAULT_FENCE = "bash"
"""The fence of a text reply when the prompt shows no single one (what the Mini-SWE bash loop parses)."""


def gold(messages: list[Message], ctx: PolicyContext) -> Output:
    """Turn 1 writes ``task.data["patch"]`` to a file outside the repository (a heredoc), turn 2
    applies it with ``git apply`` (and removes the file), turn 3 submits the staged diff."""
    patch = str(_task_field(ctx, "patch"))
    path = _scratch_path(ctx)
    turn = _turn(messages)
    if turn == 1:
        return reply(messages, ctx, "I'll write the reference patch outside the repository.",
                     heredoc_command(path, patch))
    if turn == 2:
        return reply(messages, ctx, "Now apply it.", f"git apply {path}; code=$?; rm -f {path}; exit $code")
    return reply(messages, ctx, "The fix is in place; submitting.", SUBMIT_COMMAND)


def empty(messages: list[Message], ctx: PolicyContext) -> Output:
    """Submit at once, with nothing after the sentinel: the baseline every grader must score 0."""
    return reply(messages, ctx, "Submitting without changes.", f"echo {SUBMIT_SENTINEL}")


def replay(messages: list[Message], ctx: PolicyContext) -> Output:
    """Replay the commands of the trajectory ``task.data["replay_trajectory"]`` names (see the module doc)."""
    source = str(_task_field(ctx, "replay_trajectory"))
    return _replay_turn(messages, ctx, source)


def replay_from(source: str | Path | Mapping[str, str | Path]) -> Policy:
    """A replay policy reading a run directory, or a ``{task_id: trajectory file or run directory}`` mapping."""

    def policy(messages: list[Message], ctx: PolicyContext) -> Output:
        task_id = ctx.meta.task_id or (ctx.task.task_id if ctx.task else "")
        if isinstance(source, Mapping):
            if task_id not in source:
                raise ModelError(f"replay: no trajectory for task {task_id!r}", retryable=False)
            return _replay_turn(messages, ctx, str(source[task_id]))
        return _replay_turn(messages, ctx, str(source))

    return policy


def heredoc_command(path: str, text: str) -> str:
    """A command writing ``text`` to ``path`` with a quoted heredoc whose delimiter is no line of the body.

    ``text`` gets a final newline if it lacks one. Text that would break the bash block travels as
    base64 (``base64 -d`` from the heredoc), which only changes how the command looks.
    """
    body = text if text.endswith("\n") else text + "\n"
    if any(mark in text for mark in _UNSAFE):
        body, writer = base64.encodebytes(body.encode()).decode(), "base64 -d"
    else:
        writer = "cat"
    lines = set(body.split("\n"))  # bash ends a heredoc on a whole line equal to the delimiter
    delimiter, n = "GOLD_PATCH_EOF", 0
    while delimiter in lines:
        n += 1
        delimiter = f"GOLD_PATCH_EOF_{n}"
    return f"{writer} > {path} <<'{delimiter}'\n{body}{delimiter}"


def recorded_commands(source: str | Path, task_id: str = "", sample_index: int = 0) -> list[str]:
    """The shell commands of a stored trajectory, in order (a file, or a run directory's result)."""
    return list(_commands(str(source), task_id, sample_index, _mtime(str(source))))


# ---- helpers ------------------------------------------------------------------------------------


def _replay_turn(messages: list[Message], ctx: PolicyContext, source: str) -> Output:
    task_id = ctx.meta.task_id or (ctx.task.task_id if ctx.task else "")
    commands = _commands(source, task_id, ctx.meta.sample_index, _mtime(source))
    turn = _turn(messages)
    if turn > len(commands):
        raise ModelError(f"replay of {source} has {len(commands)} commands; none is left for turn {turn}",
                         retryable=False)
    return reply(messages, ctx, f"Replaying command {turn} of {len(commands)}.", commands[turn - 1])


def _mtime(source: str) -> int:
    """Part of the cache key, so a trajectory or run that changed on disk is read again."""
    path = Path(source, "results.jsonl") if os.path.isdir(source) else Path(source)
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


@functools.lru_cache(maxsize=256)
def _commands(source: str, task_id: str, sample_index: int, mtime: int) -> tuple[str, ...]:
    path = Path(source)
    if path.is_dir():
        path = _run_dir_trajectory(path, task_id, sample_index)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"replay: cannot read trajectory {path}: {exc}", retryable=False) from None
    trajectory = doc.get("trajectory", doc) if isinstance(doc, dict) else None
    if not isinstance(trajectory, dict) or not isinstance(trajectory.get("steps"), list):
        raise ModelError(f"replay: {path} holds no trajectory steps", retryable=False)
    commands = []
    for step in trajectory["steps"]:
        for action in step.get("actions") or []:
            command = (action.get("arguments") or {}).get("command")
            if isinstance(command, str) and command.strip():
                commands.append(command)
    if not commands:
        raise ModelError(f"replay: {path} has no command to replay", retryable=False)
    return tuple(commands)


def _run_dir_trajectory(run_dir: Path, task_id: str, sample_index: int) -> Path:
    """The trajectory file of the last results line for (task_id, sample_index); read-only."""
    found: dict[str, Any] | None = None
    try:
        lines = (run_dir / "results.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ModelError(f"replay: {run_dir} is not a run directory: {exc}", retryable=False) from None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line of a run still being written
        if row.get("task_id") == task_id and row.get("sample_index", 0) == sample_index:
            found = row
    if found is None or not found.get("trajectory_path"):
        raise ModelError(f"replay: {run_dir} has no result for task {task_id!r} sample {sample_index}",
                         retryable=False)
    return run_dir / found["trajectory_path"]


def _task_field(ctx: PolicyContext, key: str) -> Any:
    if ctx.task is None:
        raise ModelError(f"this policy needs the task {ctx.meta.task_id!r}: give the scripted model its tasks",
                         retryable=False)
    value = ctx.task.data.get(key)
    if value is None:
        raise ModelError(f"task {ctx.task.task_id!r} has no data[{key!r}]", retryable=False)
    return value


def _scratch_path(ctx: PolicyContext) -> str:
    """A file outside the repository (so the submission never holds it), distinct per rollout attempt."""
    m = ctx.meta
    key = hashlib.sha256(f"{m.run_id}\0{m.rollout_id}\0{m.task_id}\0{m.attempt}".encode()).hexdigest()[:16]
    return f"/tmp/rollout-gold-{key}.patch"


def _turn(messages: list[Message]) -> int:
    return 1 + sum(1 for m in messages if m.get("role") == "assistant")


def reply(messages: list[Message], ctx: PolicyContext, thought: str, command: str) -> Output:
    """``command`` as the request asks for it: a ``bash`` tool call (``thought`` as the content) when the request
    offers that tool, else ``thought`` and a fenced block in the prompt's fence (see the module doc)."""
    if offers_bash_tool(ctx.tools):
        return {"content": thought, "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}
    if any(mark in command for mark in _UNSAFE):
        command = f'eval "$(echo {base64.b64encode(command.encode()).decode()} | base64 -d)"'
    return f"{thought}\n```{prompt_fence(messages)}\n{command}\n```"


def offers_bash_tool(tools: list[dict[str, Any]] | None) -> bool:
    """Whether ``tools`` (OpenAI function tools) hold one named ``bash`` whose ``command`` parameter is a string."""
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or function.get("name") != "bash":
            continue
        command = ((function.get("parameters") or {}).get("properties") or {}).get("command")
        kind = command.get("type") if isinstance(command, dict) else None
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return True
    return False


def prompt_fence(messages: list[Message]) -> str:
    """The language the prompt's code blocks name: the system message's, else the first user message's, when all of
    its blocks name the same one; ``DEFAULT_FENCE`` when the prompt shows none or several."""
    for role in ("system", "user"):
        first = next((m for m in messages if m.get("role") == role), None)
        if first is None:
            continue
        languages = set(_FENCE.findall(message_text(first)))
        if len(languages) == 1:
            return languages.pop()
        if languages:
            return DEFAULT_FENCE
    return DEFAULT_FENCE
