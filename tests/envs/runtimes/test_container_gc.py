"""Leftover containers: removed at exit and on SIGTERM, and collected by label after a SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest

from envs.runtimes.docker.containers import (
    OWNER_LABEL,
    OWNER_START_LABEL,
    _start_ticks,
    owner_alive,
    parse_duration,
    remove_labelled,
    remove_leftovers,
    run_gc,
)
from envs.runtimes.docker.runtime import DockerRuntime
from rollout.errors import ConfigError

STARTER = """
import asyncio, signal, sys, time
from envs.runtimes.docker.runtime import DockerRuntime
image, run_id, count, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if mode == "previous-handler":
    signal.signal(signal.SIGTERM, lambda s, f: (print("previous handler ran", flush=True), sys.exit(0)))
async def main():
    # without the dead-man's switch, so that what a killed process leaves is there to collect
    config = {"image": image, "die_with_owner": False}
    runtimes = [DockerRuntime(config, run_id=run_id, rollout_id=f"r{i}") for i in range(count)]
    await asyncio.gather(*(r.start() for r in runtimes))
    return runtimes
runtimes = asyncio.run(main())
print("started", flush=True)
if mode != "exit":
    time.sleep(600)
"""


def start_containers(image: str, count: int, mode: str = "wait") -> tuple[str, subprocess.Popen]:
    """A separate process that starts ``count`` containers of a fresh run id, then waits (or exits)."""
    run_id = f"gc-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", STARTER, image, run_id, str(count), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line != "started\n":
        proc.kill()
        pytest.fail(f"the starter failed: {line}{proc.stderr.read()}")
    return run_id, proc


def labelled(run_id: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-a", "--filter", f"label=rollout-farm.run={run_id}", "--format",
                          "{{.Names}}"], capture_output=True, text=True, check=True)
    return sorted(out.stdout.split())


@pytest.mark.docker
def test_containers_of_a_killed_process_are_collected_and_a_live_ones_kept(base_image, capsys):
    run_id, proc = start_containers(base_image, 5)
    proc.kill()
    proc.wait()
    orphans = labelled(run_id)
    assert len(orphans) == 5

    # a later attempt of the same run, alive in this process
    mine = DockerRuntime({"image": base_image}, run_id=run_id, rollout_id="live")
    asyncio.run(mine.start())
    try:
        assert run_gc(run_id, older_than="1h") == 0  # all are seconds old: nothing to do
        assert "0 container(s) removed" in capsys.readouterr().out
        assert sorted(remove_leftovers(run_id)) == orphans
        assert labelled(run_id) == [mine.name]
        assert remove_labelled(run_id=run_id) == []  # alive: kept without include_live
        assert asyncio.run(mine.exec("echo still here")).output == "still here\n"
    finally:
        asyncio.run(mine.close())
    assert labelled(run_id) == []


@pytest.mark.docker
def test_rollout_gc_prints_what_it_removed(base_image, capsys):
    run_id, proc = start_containers(base_image, 2)
    proc.kill()
    proc.wait()
    names = labelled(run_id)
    assert run_gc(run_id) == 0
    out = capsys.readouterr().out
    assert all(f"removed {name}" in out for name in names) and "2 container(s) removed" in out
    assert labelled(run_id) == []


@pytest.mark.docker
@pytest.mark.parametrize("mode, returncode", [("wait", -signal.SIGTERM), ("previous-handler", 0)])
def test_sigterm_removes_live_containers_and_keeps_the_previous_handler(base_image, mode, returncode):
    run_id, proc = start_containers(base_image, 2, mode)
    assert len(labelled(run_id)) == 2
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == returncode, err
    assert ("previous handler ran" in out) == (mode == "previous-handler")
    assert labelled(run_id) == []


@pytest.mark.docker
def test_containers_not_closed_are_removed_at_exit(base_image):
    run_id, proc = start_containers(base_image, 2, "exit")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert labelled(run_id) == []


def test_owner_alive_checks_host_pid_and_start_time():
    me, host = os.getpid(), socket.gethostname()
    ticks = str(_start_ticks(me))
    done = subprocess.Popen(["true"])
    done.wait()
    assert owner_alive({OWNER_LABEL: f"{host}:{me}", OWNER_START_LABEL: ticks})
    assert not owner_alive({OWNER_LABEL: f"{host}:{me}", OWNER_START_LABEL: str(int(ticks) + 1)})  # pid reused
    assert not owner_alive({OWNER_LABEL: f"{host}:{done.pid}"})
    assert owner_alive({OWNER_LABEL: f"elsewhere-{host}:{done.pid}"})  # cannot tell: kept
    assert not owner_alive({})


@pytest.mark.parametrize("text, seconds", [("90", 90), ("30s", 30), ("30m", 1800), ("2h", 7200), ("1d", 86400),
                                           ("1h30m", 5400), ("1.5h", 5400), (45, 45)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1y", "-1h", "2 h x"])
def test_parse_duration_rejects_nonsense(text):
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(text)
