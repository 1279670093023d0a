"""Runtimes: the conformance checker over null and local, and the local runtime's process hygiene."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from runtime_helpers import processes_with, survivors

from envs.registry import RUNTIMES
from envs.runtimes.check import check_runtime
from envs.runtimes.local import LocalRuntime
from envs.runtimes.null import NullRuntime
from rollout.errors import ConfigError, RuntimeFailure
from rollout.protocols import ExecResult


def local(tmp_path, **overrides) -> LocalRuntime:
    return LocalRuntime({"allow_host_exec": True, "root": str(tmp_path / "workspaces"), **overrides})


def marker() -> str:
    """A sleep argument no other process on the machine has in its command line."""
    return f"100.{random.randrange(10**8, 10**9)}"


async def run_watched(runtime, command: str, text: str, expected: int, timeout: float) -> tuple[ExecResult, int, float]:
    """Run ``command``, wait to see ``expected`` of its processes alive, then return (result, seen, seconds)."""
    began = time.monotonic()
    pending = asyncio.ensure_future(runtime.exec(command, timeout=timeout))
    seen = 0
    while not pending.done() and seen < expected:
        seen = len(processes_with(text))
        await asyncio.sleep(0.02)
    result = await pending
    return result, seen, time.monotonic() - began


@pytest.mark.parametrize(
    "name, config, executes",
    [("null", {}, False), ("local", {"allow_host_exec": True}, True)],
)
def test_registered_runtimes_pass_the_conformance_checker(name, config, executes, tmp_path):
    cls = RUNTIMES.load(name)
    if name == "local":
        config = {**config, "root": str(tmp_path)}
    asyncio.run(check_runtime(lambda: cls(config), executes=executes))


class ForgetsExitCodes(LocalRuntime):
    async def exec(self, command, timeout=None, cwd=None, env=None):
        result = await super().exec(command, timeout, cwd, env)
        return result.model_copy(update={"returncode": 0})


class RunsAfterClose(NullRuntime):
    async def exec(self, command, timeout=None, cwd=None, env=None):
        return ExecResult(output="", returncode=0)


@pytest.mark.parametrize(
    "factory, executes, complaint",
    [
        (lambda tmp: ForgetsExitCodes({"allow_host_exec": True, "root": str(tmp)}), True, "exit code"),
        (lambda tmp: RunsAfterClose(), False, "after close"),
    ],
    ids=["lost-exit-code", "exec-after-close"],
)
def test_checker_rejects_a_broken_runtime(factory, executes, complaint, tmp_path):
    with pytest.raises(AssertionError, match=complaint):
        asyncio.run(check_runtime(lambda: factory(tmp_path), executes=executes))


@pytest.mark.parametrize("shape", ["sleep {m}", "sleep {m} & sleep {m}; wait"], ids=["foreground", "background"])
def test_timeout_kills_the_whole_process_group(shape, tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        m = marker()
        expected = 1 if shape == "sleep {m}" else 3  # bash execs a lone command; else bash + two sleeps
        result, seen, seconds = await run_watched(runtime, shape.format(m=m), m, expected, timeout=2)
        left = await survivors(m)
        await runtime.close()
        return result, seen, seconds, left

    result, seen, seconds, left = asyncio.run(scenario())
    assert seen >= 1, "the test could not see the command's processes"
    assert result.timed_out and result.returncode != 0
    assert left == [], f"processes survived the timeout: {left}"
    assert seconds < 2 + 5


def test_background_job_left_behind_is_killed_without_waiting_for_the_timeout(tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        m = marker()
        result, _, seconds = await run_watched(runtime, f"sleep {m} & echo started", m, 1, timeout=20)
        left = await survivors(m)
        await runtime.close()
        return result, seconds, left

    result, seconds, left = asyncio.run(scenario())
    assert result.output == "started\n" and result.returncode == 0 and not result.timed_out
    assert seconds < 10, "exec waited on the pipe held open by the background job"
    assert left == []


def test_cancelled_exec_kills_its_processes(tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        m = marker()
        pending = asyncio.ensure_future(runtime.exec(f"sleep {m} & sleep {m}; wait", timeout=60))
        while len(processes_with(m)) < 3:
            await asyncio.sleep(0.02)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        left = await survivors(m)
        await runtime.close()
        return left

    assert asyncio.run(scenario()) == []


def test_yes_stops_at_the_output_cap(tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        result = await runtime.exec("yes", timeout=60)
        await runtime.close()
        return result

    result = asyncio.run(scenario())
    assert result.truncated and not result.timed_out
    assert len(result.output) == 1_000_000 and result.output.startswith("y\ny\n")


def test_non_utf8_output_is_replaced_not_a_crash(tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        result = await runtime.exec(r"printf '\xff\xfe'; echo done")
        await runtime.close()
        return result

    result = asyncio.run(scenario())
    assert result.output == "\ufffd\ufffddone\n" and result.returncode == 0


def test_local_runtime_refuses_host_exec_unless_allowed(tmp_path):
    runtime = LocalRuntime({"root": str(tmp_path)})
    with pytest.raises(ConfigError) as caught:
        asyncio.run(runtime.start())
    assert caught.value.field == "runtime.allow_host_exec"
    assert "on this host" in str(caught.value) and "runtime.allow_host_exec=true" in str(caught.value)
    assert not any(tmp_path.iterdir()), "a refused runtime must not create a workspace"

    async def trusted():
        runtime = LocalRuntime({"root": str(tmp_path)}, trusted_model=True)
        await runtime.start()
        result = await runtime.exec("echo scripted")
        await runtime.close()
        return result.output

    assert asyncio.run(trusted()) == "scripted\n"


def test_workspace_lifecycle(tmp_path):
    async def scenario(keep: bool):
        runtime = local(tmp_path, keep_workspace=keep)
        with pytest.raises(RuntimeFailure, match="before start"):
            await runtime.exec("true")
        await runtime.start()
        await runtime.write_file("a/b.txt", b"x")
        workspace = runtime.workspace
        assert os.path.isfile(os.path.join(workspace, "a", "b.txt"))
        await runtime.close()
        return os.path.exists(workspace)

    assert asyncio.run(scenario(keep=False)) is False
    assert asyncio.run(scenario(keep=True)) is True


def test_vanished_workspace_is_a_runtime_failure(tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        os.rmdir(runtime.workspace)
        try:
            await runtime.exec("true")
        finally:
            await runtime.close()

    with pytest.raises(RuntimeFailure, match="gone"):
        asyncio.run(scenario())


def test_env_layers_and_inheritance(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_TEST_HOST_VAR", "host")
    show = 'echo "${ROLLOUT_TEST_HOST_VAR-none} ${BASE-none} ${CALL-none}"'

    async def scenario(inherit: bool):
        runtime = local(tmp_path, env={"BASE": "base", "CALL": "base"}, inherit_env=inherit)
        await runtime.start()
        plain = await runtime.exec(show)
        layered = await runtime.exec(show, env={"CALL": "call"})
        await runtime.close()
        return plain.output, layered.output

    assert asyncio.run(scenario(True)) == ("host base base\n", "host base call\n")
    assert asyncio.run(scenario(False)) == ("none base base\n", "none base call\n")


def test_close_during_a_command_kills_it_and_fails_the_exec(tmp_path):
    async def scenario():
        runtime = local(tmp_path)
        await runtime.start()
        m = marker()
        pending = asyncio.ensure_future(runtime.exec(f"sleep {m}", timeout=60))
        while not processes_with(m):
            await asyncio.sleep(0.02)
        await runtime.close()
        with pytest.raises(RuntimeFailure, match="closed"):
            await pending
        return await survivors(m)

    assert asyncio.run(scenario()) == []


def test_null_runtime_canned_echo_and_delay():
    async def scenario():
        runtime = NullRuntime({"output": "ok", "returncode": 2, "echo": True, "delay": 0.05})
        with pytest.raises(RuntimeFailure):
            await runtime.exec("ls")
        await runtime.start()
        normal = await runtime.exec("ls -la")
        slow = await runtime.exec("ls", timeout=0.01)
        await runtime.close()
        return normal, slow

    normal, slow = asyncio.run(scenario())
    assert (normal.output, normal.returncode, normal.timed_out) == ("ls -la\nok", 2, False)
    assert slow.timed_out


def test_null_runtime_serves_thousands_of_concurrent_rollouts():
    async def rollout(i: int) -> str:
        runtime = NullRuntime({"echo": True, "delay": 0.01})
        await runtime.start()
        outputs = [(await runtime.exec(f"step {i} {n}")).output for n in range(5)]
        await runtime.close()
        return outputs[-1]

    async def scenario():
        return await asyncio.gather(*(rollout(i) for i in range(2500)))

    outputs = asyncio.run(scenario())
    assert outputs == [f"step {i} 4\n" for i in range(2500)]
