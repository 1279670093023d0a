"""The ``harbor_solver`` scripted policy: the task's (or the step's) own ``solve.sh`` as one bash block, read from the
task's archive, then the submission; what it cannot play refused by name."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from agents.parsers import BashBlockParser
from agents.swe_agent import MiniSweAgent
from envs.harbor.archive import task_files
from envs.harbor.dataset import load_harbor_tasks
from envs.harbor.policies import harbor_solver
from rollout.errors import SUBMIT_SENTINEL, ModelError
from rollout.models.scripted import PolicyContext
from rollout.protocols import EnvReset
from rollout.records import RequestMeta

TASKS = Path(__file__).resolve().parents[3] / "configs" / "harbor" / "tasks"


def opening(task, prompt: str | None = None) -> list[dict]:
    """The Mini-SWE agent's first messages for ``task`` (a later step: its instruction as the prompt)."""
    shown = task if prompt is None else task.model_copy(update={"prompt": prompt})
    return MiniSweAgent().opening(shown, EnvReset(info={"cwd": "/app"}))


def command(reply: str) -> str:
    [action] = BashBlockParser().parse({"role": "assistant", "content": reply})
    return action.arguments["command"]


def play(task, messages):
    return harbor_solver(messages, PolicyContext(RequestMeta(task_id=task.task_id), task, None))


def test_it_runs_the_solution_then_submits():
    task = load_harbor_tasks(TASKS / "hello-file")[0]
    first = play(task, opening(task))
    assert "/app/hello.txt" in command(first) and command(first).endswith("> /app/hello.txt")
    then = play(task, opening(task) + [{"role": "assistant", "content": first}, {"role": "user", "content": "ok"}])
    assert command(then) == f"echo {SUBMIT_SENTINEL}"


def test_each_step_of_a_multi_step_task_gets_its_own_solution():
    task = load_harbor_tasks(TASKS / "two-steps")[0]
    files = task_files(task.data["task_archive"])
    assert "echo one > /app/list.txt" in command(play(task, opening(task)))
    second = opening(task, files.text("steps/extend/instruction.md"))
    assert "echo two >> /app/list.txt" in command(play(task, second))


def write_task(root: Path, solution: dict[str, str]) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text("FROM rollout-farm/base:bookworm\n")
    (root / "task.toml").write_text('[solution.env]\nWORD = "a b"\n')
    (root / "instruction.md").write_text("Do it.\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "solution").mkdir()
    for name, text in solution.items():
        (root / "solution" / name).write_text(text)
    return root


def test_the_solutions_variables_are_exported_and_a_fence_in_the_script_travels_as_base64(tmp_path):
    task = load_harbor_tasks(write_task(tmp_path / "fenced", {"solve.sh": "printf '```' > out.txt\n"}))[0]
    sent = command(play(task, opening(task)))
    assert sent.startswith('bash -c "$(echo ') and "```" not in sent
    decoded = base64.b64decode(sent.split("echo ", 1)[1].split(" |", 1)[0]).decode()
    assert decoded == "export WORD='a b'\nprintf '```' > out.txt"


def test_what_it_cannot_play_is_refused_by_name(tmp_path):
    task = load_harbor_tasks(write_task(tmp_path / "more", {"solve.sh": "bash /solution/x.sh\n", "x.sh": "true\n"}))[0]
    with pytest.raises(ModelError, match="also x.sh"):
        play(task, opening(task))
    with pytest.raises(ModelError, match="not one the model was handed"):
        harbor_solver(opening(task), PolicyContext(RequestMeta(task_id="other"), None, None))
