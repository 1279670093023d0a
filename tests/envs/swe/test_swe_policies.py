"""Scripted SWE policies in the real Mini-SWE loop: gold fixes the instance, empty submits nothing, replay repeats."""

import asyncio
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agents.parsers.bash_block import BashBlockParser
from agents.swe_agent import MiniSweAgent
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from envs.swe import policies as swe_policies
from envs.swe.logs.pytest_log import PASSING, parse_log_pytest
from envs.swe.mini import build
from rollout.data.dataset import load_tasks
from rollout.errors import SUBMIT_SENTINEL, ExitReason
from rollout.models.scripted import PolicyContext, ScriptedModel, to_message
from rollout.records import Action, RequestMeta, RolloutResult, Step, Task, Trajectory
from rollout.runner import run_rollout
from rollout.store.run_dir import RunStore

NAMES = ["csvstats", "semver", "wordwrap"]


@pytest.fixture(scope="session")
def tasks(tmp_path_factory):
    """A few mini SWE instances, built once, loaded as a run would load them; ``data["_dir"]`` is the dataset dir."""
    path = build(tmp_path_factory.mktemp("swe_mini"), names=NAMES)
    loaded = {t.task_id: t for t in load_tasks(path)}
    for task in loaded.values():
        task.data["_dir"] = str(path.parent)
    return loaded


def rollout(task, policy, sample_index=0):
    """One rollout in a fresh host workspace holding the instance's repo at base_commit."""
    bundle = Path(task.data["_dir"], task.data["repo_path"])
    setup = f"git clone -q {shlex.quote(str(bundle))} . && git checkout -q {task.data['base_commit']}"
    env = ShellEnvironment(LocalRuntime(trusted_model=True), {"setup_commands": [setup]})
    agent = MiniSweAgent()
    model = ScriptedModel(policy=policy, tasks={task.task_id: task})
    meta = RequestMeta(rollout_id=f"{task.task_id}#{sample_index}", task_id=task.task_id, sample_index=sample_index)
    return asyncio.run(run_rollout(task, agent, model, env, limits=agent.limits(), meta=meta))


def git(cwd, *args, stdin=None):
    return subprocess.run(["git", *args], cwd=cwd, input=stdin, check=True, capture_output=True, text=True).stdout


def checkout(task, where, *patches):
    git(None, "clone", "-q", str(Path(task.data["_dir"], task.data["repo_path"])), str(where))
    for patch in patches:
        git(where, "apply", "-", stdin=patch)
    return where


def tree_of(repo):
    git(repo, "add", "-A")
    return git(repo, "write-tree").strip()


def commands(result):
    return [a.arguments["command"] for step in result.trajectory.steps for a in step.actions]


@pytest.mark.parametrize("name", NAMES)
def test_gold_submission_is_the_reference_fix(tasks, tmp_path, name):
    task = tasks[f"mini__{name}-1"]
    result = rollout(task, swe_policies.gold)
    assert result.exit_reason == ExitReason.SUBMITTED and len(result.trajectory.steps) == 3
    submitted = checkout(task, tmp_path / "submitted", result.submission)
    # The same tree as the reference fix: nothing missing, nothing extra (no stray patch file).
    assert tree_of(submitted) == tree_of(checkout(task, tmp_path / "gold", task.data["patch"]))
    # Graded as the harness would: test files from test_patch, then FAIL_TO_PASS and PASS_TO_PASS must pass.
    git(submitted, "apply", "-", stdin=task.data["test_patch"])
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    ran = subprocess.run(["bash", "-c", task.data["test_cmd"]], check=False, cwd=submitted, env=env,
                         capture_output=True, text=True)
    statuses = parse_log_pytest(ran.stdout)
    assert all(statuses.get(t) in PASSING for t in task.data["FAIL_TO_PASS"] + task.data["PASS_TO_PASS"])


def test_empty_submits_an_empty_diff(tasks):
    result = rollout(tasks["mini__semver-1"], swe_policies.empty)
    assert result.exit_reason == ExitReason.SUBMITTED
    assert result.submission == "" and len(result.trajectory.steps) == 1


@pytest.mark.parametrize(
    "text",
    [
        "diff --git a/x b/x\n+plain\n",
        "GOLD_PATCH_EOF\nGOLD_PATCH_EOF_1\nbody\n",
        "+```python\n+x = 1\n+```\n+<think>not reasoning</think>\n",
        "no final newline",
    ],
    ids=["plain", "delimiter inside", "fence and think tags", "no final newline"],
)
def test_gold_writes_any_patch_text_exactly(tmp_path, text):
    ctx = PolicyContext(RequestMeta(rollout_id="r#0", task_id="t"), Task(task_id="t", data={"patch": text}), None)
    [action] = BashBlockParser().parse({"role": "assistant", "content": swe_policies.gold([], ctx)})
    command = action.arguments["command"]
    target = command.split(" > ", 1)[1].split(" ", 1)[0]
    assert target.startswith("/tmp/") and ctx.meta.rollout_id not in target
    subprocess.run(["bash", "-c", command.replace(target, str(tmp_path / "p"))], check=True)
    assert (tmp_path / "p").read_text() == (text if text.endswith("\n") else text + "\n")


def record(task, tmp_path):
    """A gold rollout of ``task`` stored in a real run directory; (run dir, trajectory file, result)."""
    result = rollout(task, swe_policies.gold)
    store = RunStore(tmp_path / "run").open({"model": "scripted"}, {})
    stored = store.append(result)
    store.close()
    return store.run_dir, store.run_dir / stored.trajectory_path, result


@pytest.mark.parametrize("source", ["trajectory file", "run directory", "replay_from mapping"])
def test_replay_repeats_a_recorded_trajectory(tasks, tmp_path, source):
    recorded_task = tasks["mini__wordwrap-1"]
    run_dir, trajectory, original = record(recorded_task, tmp_path)
    if source == "replay_from mapping":
        task, policy = recorded_task, swe_policies.replay_from({recorded_task.task_id: trajectory})
    else:
        where = trajectory if source == "trajectory file" else run_dir
        task = recorded_task.model_copy(update={"data": {**recorded_task.data, "replay_trajectory": str(where)}})
        policy = swe_policies.replay
    replayed = rollout(task, policy)
    assert commands(replayed) == commands(original) == swe_policies.recorded_commands(trajectory)
    assert replayed.exit_reason == ExitReason.SUBMITTED and replayed.submission == original.submission


def test_replay_that_runs_out_of_commands_is_a_model_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"steps": [{"actions": [{"arguments": {"command": "echo hi"}}]}, {"actions": []}]}))
    task = Task(task_id="t", prompt="say hi", data={"replay_trajectory": str(path)})
    env = ShellEnvironment(LocalRuntime(trusted_model=True))
    agent = MiniSweAgent()
    result = asyncio.run(run_rollout(task, agent, ScriptedModel(policy=swe_policies.replay, tasks={"t": task}), env,
                                     limits=agent.limits(), meta=RequestMeta(rollout_id="t#0", task_id="t")))
    assert commands(result) == ["echo hi"]
    assert result.status == "infra_failed" and result.error.type == "ModelError"
    assert "none is left for turn 2" in result.error.message


def test_replay_of_a_run_directory_picks_the_sample_and_its_last_attempt(tmp_path):
    store = RunStore(tmp_path / "run").open({}, {})
    for sample, attempt, command in [(0, 1, "echo zero"), (1, 1, "echo first try"), (1, 2, "echo one")]:
        step = Step(index=1, message={"role": "assistant", "content": ""},
                    actions=[Action(kind="bash", name="bash", arguments={"command": command})])
        store.append(RolloutResult(rollout_id=f"t#{sample}", task_id="t", sample_index=sample, attempt=attempt,
                                   status="completed", exit_reason=ExitReason.SUBMITTED,
                                   trajectory=Trajectory(steps=[step])))
    store.close()
    assert swe_policies.recorded_commands(store.run_dir, "t", 0) == ["echo zero"]
    assert swe_policies.recorded_commands(store.run_dir, "t", 1) == ["echo one"]


# ---- the reply's form follows the request ---------------------------------------------------------------------------

BASH_TOOL = {"type": "function", "function": {"name": "bash", "description": "Execute a bash command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
"""The tool mini-swe-agent 2.x's default config offers."""


def turns(policy, ctx, count, system="You run commands."):
    """``count`` replies of ``policy``, each fed back as the assistant's message before the next turn."""
    messages, replies = [{"role": "system", "content": system}, {"role": "user", "content": "fix it"}], []
    for _ in range(count):
        output = policy(messages, ctx)
        replies.append(output)
        messages += [to_message(output)[0], {"role": "user", "content": "<returncode>0</returncode>"}]
    return replies


def gold_context(tasks, tools):
    task = tasks["mini__csvstats-1"]
    return PolicyContext(RequestMeta(rollout_id="r#0", task_id=task.task_id), task, tools)


def test_gold_offered_the_bash_tool_calls_it_with_the_blocks_commands(tasks):
    blocks = turns(swe_policies.gold, gold_context(tasks, None), 3)
    calls = turns(swe_policies.gold, gold_context(tasks, [BASH_TOOL]), 3)
    for block, call in zip(blocks, calls):
        [action] = BashBlockParser().parse({"role": "assistant", "content": block})
        [tool_call] = call["tool_calls"]
        assert tool_call == {"name": "bash", "arguments": {"command": action.arguments["command"]}}
        assert call["content"] == block.split("\n```", 1)[0]  # the thought, as the content
    assert calls[-1]["tool_calls"][0]["arguments"]["command"].startswith(f"echo {SUBMIT_SENTINEL}")
    message, finish = to_message(calls[0])
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "bash"


def test_a_tool_that_is_not_a_bash_command_gets_a_block():
    ctx = PolicyContext(RequestMeta(rollout_id="r#0", task_id="t"), Task(task_id="t"), None)
    other = {"type": "function", "function": {"name": "search", "parameters": {"properties": {"command": {
        "type": "string"}}}}}
    untyped = {"type": "function", "function": {"name": "bash", "parameters": {"properties": {"cmd": {}}}}}
    for tools in ([other], [untyped], []):
        ctx.tools = tools
        assert swe_policies.empty([], ctx) == f"Submitting without changes.\n```bash\necho {SUBMIT_SENTINEL}\n```"


@pytest.mark.parametrize(("system", "fence"), [
    ("Reply with one block:\n\n```mswea_bash_command\nyour_command_here\n```\n", "mswea_bash_command"),
    ("Reply with one block:\n\n```sh\nls\n```\nor\n```sh\npwd\n```", "sh"),
    ("Reply with one bash block:\n```bash\nls\n```\nnever python:\n```python\nprint()\n```", "bash"),
    ("No example here.", "bash"),
], ids=["one custom fence", "one fence twice", "two languages", "no example"])
def test_a_text_reply_uses_the_fence_the_prompt_shows(system, fence):
    ctx = PolicyContext(RequestMeta(rollout_id="r#0", task_id="t"), Task(task_id="t"), None)
    [reply] = turns(swe_policies.empty, ctx, 1, system=system)
    assert reply == f"Submitting without changes.\n```{fence}\necho {SUBMIT_SENTINEL}\n```"
    # what mini-swe-agent's text-based model (its default action_regex) reads from it
    if fence == "mswea_bash_command":
        assert re.findall(r"```mswea_bash_command\s*\n(.*?)\n```", reply, re.DOTALL) == [f"echo {SUBMIT_SENTINEL}"]


def test_replay_offered_the_bash_tool_sends_a_recorded_command_as_it_was(tmp_path):
    command = "printf '```\\n<think>x</think>\\n'"
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"steps": [{"actions": [{"arguments": {"command": command}}]}]}))
    task = Task(task_id="t", data={"replay_trajectory": str(path)})
    ctx = PolicyContext(RequestMeta(rollout_id="t#0", task_id="t"), task, [BASH_TOOL])
    [call] = turns(swe_policies.replay, ctx, 1)
    assert call["tool_calls"] == [{"name": "bash", "arguments": {"command": command}}]
    ctx.tools = None
    [block] = turns(swe_policies.replay, ctx, 1)
    assert block.count("```") == 2 and "base64 -d" in block  # in a block, it travels encoded
