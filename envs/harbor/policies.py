"""A scripted policy that plays Harbor tasks through model turns, as a model that knows the answer would: turn 1
answers with the task's own ``solution/solve.sh`` as one bash block (with ``solution.env`` exported), turn 2 submits
(``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``). Run by the Mini-SWE bash agent (``agent.type mini_swe``), the
script reaches the container the way any model's command does, and the task's tests grade what it did.

The policy runs beside the model (a worker, the scripted server, a Serve replica) with the task the farm handed it:
it reads the script from the task's archive there, never from the agent's container. A multi-step task's steps
each start a fresh conversation; the step is the one whose ``instruction.md`` the conversation's first user message
holds, and its own ``steps/<name>/solution/solve.sh`` is played (the task's ``solution/`` when it has none).
"""

from __future__ import annotations

import base64
import shlex

from envs.harbor.archive import TaskFiles, task_files
from envs.harbor.dataset import config_of
from rollout.context import message_text
from rollout.errors import SUBMIT_SENTINEL, ModelError
from rollout.models.scripted import Output, PolicyContext
from rollout.records import Message, Task

UNSAFE = ("```", "<think>", "</think>")
"""Text that would end the bash block early or be dropped as reasoning by the parser: such a script is sent as
base64 (only how the command looks changes)."""


def harbor_solver(messages: list[Message], ctx: PolicyContext) -> Output:
    """Turn 1: the step's ``solve.sh`` as the command; turn 2: submit."""
    if any(m.get("role") == "assistant" for m in messages):
        return f"The solution ran; submitting.\n```bash\necho {SUBMIT_SENTINEL}\n```"
    task = ctx.task
    if task is None or "task_archive" not in task.data:
        raise ModelError(f"harbor_solver plays Harbor tasks: task {ctx.meta.task_id!r} is not one the model was "
                         "handed", retryable=False)
    files = task_files(task.data["task_archive"])  # read once per process; a carried archive is fetched here
    folder = solution_folder(files, task, first_user_text(messages))
    script = files.text(f"{folder}/solve.sh")
    others = sorted(set(files.under(folder)) - {"solve.sh"})
    if script is None or others:
        raise ModelError(f"harbor_solver plays a lone {folder}/solve.sh; task {task.task_id!r} has "
                         f"{'none' if script is None else 'also ' + ', '.join(others[:5])}", retryable=False)
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in config_of(task).solution_env.items())
    command = exports + script.strip()
    if any(mark in command for mark in UNSAFE):
        command = f'bash -c "$(echo {base64.b64encode(command.encode()).decode()} | base64 -d)"'
    return f"I know how to do this; running the solution.\n```bash\n{command}\n```"


def first_user_text(messages: list[Message]) -> str:
    return next((message_text(m) for m in messages if m.get("role") == "user"), "")


def solution_folder(files: TaskFiles, task: Task, opening: str) -> str:
    """``steps/<name>/solution`` of the step whose instruction ``opening`` holds (the longest that matches), or
    ``solution``: a task without steps, or a step without a solution of its own."""
    matches = []
    for name in task.data.get("harbor", {}).get("steps") or ():
        instruction = (files.text(f"steps/{name}/instruction.md") or "").strip()
        if instruction and instruction in opening:
            matches.append((len(instruction), name))
    if matches:
        step = max(matches)[1]
        if f"steps/{step}/solution/solve.sh" in files.members:
            return f"steps/{step}/solution"
    return "solution"
