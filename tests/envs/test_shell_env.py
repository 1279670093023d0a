"""ShellEnvironment over the null and local runtimes: reset, bash steps, setup, failures, close."""

from __future__ import annotations

import asyncio

import pytest

from envs.runtimes.local import LocalRuntime
from envs.runtimes.null import NullRuntime
from envs.shell_env import ShellEnvironment
from rollout.errors import EnvironmentFailure, RuntimeFailure
from rollout.protocols import Environment
from rollout.records import Action, Task

TASK = Task(task_id="t1", prompt="do it")


def make_runtime(name: str, tmp_path, **overrides):
    if name == "null":
        return NullRuntime({"echo": True, **overrides})
    return LocalRuntime({"allow_host_exec": True, "root": str(tmp_path / "ws"), **overrides})


def bash(command: str, call_id: str | None = None) -> Action:
    return Action(kind="bash", name="bash", arguments={"command": command}, call_id=call_id)


def run(env: ShellEnvironment, *steps: list[Action]):
    """Reset, run each round of actions, close; return (reset info, observations per round)."""

    async def scenario():
        try:
            reset = await env.reset(TASK)
            return reset.info, [await env.step(actions) for actions in steps]
        finally:
            await env.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize("name", ["null", "local"])
def test_bash_actions_run_in_order_and_report_their_result(name, tmp_path):
    env = ShellEnvironment(make_runtime(name, tmp_path), {"command_timeout": 5})
    assert isinstance(env, Environment)
    info, rounds = run(env, [bash("echo one", "c1"), bash("echo two", "c2")])
    assert info["runtime"] == type(env.runtime).__name__ and info["cwd"]
    first, second = rounds[0]
    assert "one" in first.content and "two" in second.content
    assert first.success and first.action_name == "bash" and first.call_id == "c1" and second.call_id == "c2"
    assert first.info["command"] == "echo one" and first.info["returncode"] == 0
    assert first.info["timed_out"] is False and first.info["truncated"] is False and first.info["duration"] >= 0


@pytest.mark.parametrize("name", ["null", "local"])
@pytest.mark.parametrize(
    "action",
    [
        Action(kind="tool", name="search", arguments={"query": "x"}, call_id="c9"),
        Action(kind="bash", name="bash", arguments={"cmd": "ls"}),
    ],
    ids=["other-kind", "no-command"],
)
def test_an_action_that_is_not_a_bash_command_is_an_invalid_arguments_observation(name, action, tmp_path):
    _, rounds = run(ShellEnvironment(make_runtime(name, tmp_path)), [action, bash("echo after")])
    bad, after = rounds[0]
    assert bad.success is False and bad.info["error"] == "invalid_arguments" and bad.call_id == action.call_id
    assert "after" in after.content and after.success, "one bad action must not stop the round"


def test_failing_timed_out_and_truncated_commands_are_unsuccessful_observations(tmp_path):
    env = ShellEnvironment(make_runtime("local", tmp_path, max_output_bytes=1000), {"command_timeout": 1})
    _, rounds = run(env, [bash("echo nope >&2; exit 4"), bash("sleep 30"), bash("yes")])
    failed, slow, loud = rounds[0]
    assert (failed.success, failed.info["returncode"], failed.content) == (False, 4, "nope\n")
    assert slow.success is False and slow.info["timed_out"] is True
    assert loud.success is False and loud.info["truncated"] is True and loud.info["returncode"] == -9
    assert loud.content == "y\n" * 500 + "[output truncated at 1,000 bytes; the command was stopped]\n"


def test_a_truncated_output_is_stored_as_head_and_tail_with_the_count_left_out(tmp_path):
    env = ShellEnvironment(make_runtime("local", tmp_path, max_output_bytes=1000), {"truncated_keep_chars": 100})
    _, rounds = run(env, [bash("seq 1000 9999"), bash("seq 3")])
    [(loud, quiet)] = rounds
    head, tail = "".join(f"{i}\n" for i in range(1000, 1010)), "".join(f"{i}\n" for i in range(1190, 1200))
    assert loud.content == head + "\n... 900 characters elided ...\n" + tail + (
        "[output truncated at 1,000 bytes; the command was stopped]\n")
    assert loud.info["elided_chars"] == 900 and loud.info["output_limit"] == 1000
    assert quiet.content == "1\n2\n3\n" and quiet.info["elided_chars"] == 0, "only a truncated output is elided"


def test_setup_commands_cwd_and_env_apply_to_every_command(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    config = {
        "cwd": str(project),
        "setup_commands": ["mkdir -p build", "echo prepared > marker.txt"],
        "env": {"PAGER": "cat"},
    }
    env = ShellEnvironment(make_runtime("local", tmp_path), config)
    info, rounds = run(env, [bash('cat marker.txt; pwd; echo "$PAGER"')])
    assert info["cwd"] == str(project)
    assert rounds[0][0].content == f"prepared\n{project}\ncat\n"


@pytest.mark.parametrize("name", ["null", "local"])
def test_a_failing_setup_command_is_an_environment_failure(name, tmp_path):
    runtime = make_runtime(name, tmp_path, returncode=7) if name == "null" else make_runtime(name, tmp_path)
    env = ShellEnvironment(runtime, {"setup_commands": ["echo broken; exit 7"]})
    with pytest.raises(EnvironmentFailure, match="exited with 7"):
        run(env)


@pytest.mark.parametrize("name", ["null", "local"])
def test_close_is_idempotent_and_closes_the_runtime(name, tmp_path):
    env = ShellEnvironment(make_runtime(name, tmp_path))

    async def scenario():
        await env.reset(TASK)
        await env.close()
        await env.close()
        with pytest.raises(RuntimeFailure):
            await env.runtime.exec("echo too late")
        with pytest.raises(RuntimeFailure):
            await env.step([bash("echo too late")])

    asyncio.run(scenario())
