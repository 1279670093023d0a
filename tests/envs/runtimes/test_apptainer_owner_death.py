"""An apptainer instance dies with the process that started it: SIGKILL the owner (no exit hook runs) and its
watchdog stops the instance and removes its workspace within seconds; after a normal close the watchdog has
nothing to stop. On the real CLI (skips without one unless ROLLOUT_REQUIRE_APPTAINER=1), through a wrapper that
logs each call so the stops can be counted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import processes_with

BASE_IMAGE = "rollout-farm/base:bookworm"
ROOT = str(Path(__file__).resolve().parents[3])

OWNER = """
import asyncio, sys, time
from envs.runtimes.apptainer.runtime import ApptainerRuntime
binary, image, workspace_root, cache_dir, close = sys.argv[1:6]
runtime = ApptainerRuntime({"binary": binary, "image": image, "workspace_root": workspace_root,
                            "cache_dir": cache_dir}, run_id="owner-death")
asyncio.run(runtime.start())
if close == "close":
    asyncio.run(runtime.close())
print(runtime.name, runtime.workspace, flush=True)
time.sleep(600)
"""


def _unavailable(message: str) -> None:
    if os.environ.get("ROLLOUT_REQUIRE_APPTAINER", "") not in ("", "0", "false", "no"):
        pytest.fail(f"ROLLOUT_REQUIRE_APPTAINER is set but {message}")
    pytest.skip(f"{message} (set ROLLOUT_REQUIRE_APPTAINER=1 to make this an error)")


@pytest.fixture(scope="session")
def apptainer_image(tmp_path_factory) -> tuple[str, str]:
    """The real CLI and a cache directory holding the base image's conversion, made once a session."""
    real = shutil.which("apptainer") or shutil.which("singularity")
    if real is None:
        _unavailable("no apptainer or singularity binary is on PATH")
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0
    ):
        _unavailable(f"docker has no {BASE_IMAGE} image to convert (`rollout images base` builds it)")
    return real, str(tmp_path_factory.mktemp("apptainer-cache"))


@pytest.fixture
def logged_cli(apptainer_image, tmp_path) -> tuple[str, Path, str]:
    """A wrapper of the real CLI that logs each call's arguments: its path, the log, the real binary."""
    real, _ = apptainer_image
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "bin" / "apptainer"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\nexec '{real}' \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper), log, real


def instance_names(binary: str) -> set[str]:
    listed = subprocess.run([binary, "instance", "list", "--json"], capture_output=True, text=True, check=True)
    return {item["instance"] for item in json.loads(listed.stdout)["instances"]}


def stops_of(log: Path, name: str) -> int:
    return sum(line.split() == ["instance", "stop", "--force", name] for line in log.read_text().splitlines())


def start_owner(binary: str, cache_dir: str, workspace_root: Path, close: bool) -> tuple[subprocess.Popen, str, str]:
    """A process that starts an instance (and closes it, with ``close``), prints its name and workspace, and
    sleeps."""
    argv = [binary, f"docker-daemon:{BASE_IMAGE}", str(workspace_root), cache_dir, "close" if close else "keep"]
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    printed = owner.stdout.readline().split()
    if len(printed) != 2:
        owner.kill()
        _, err = owner.communicate()
        pytest.fail(f"the owner did not start its instance: {err[-3000:]}")
    return owner, printed[0], printed[1]


def watchdogs_of(binary: str) -> list[int]:
    return processes_with(f"envs.runtimes.apptainer.owner_watch\0{binary}")


def wait_for(condition, seconds: float) -> float | None:
    """Seconds until ``condition()`` holds, or none if it still does not after ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if condition():
            return time.monotonic() - began
        time.sleep(0.1)
    return None


@pytest.mark.apptainer
def test_a_sigkilled_owners_instance_and_workspace_are_gone_within_seconds(apptainer_image, logged_cli, tmp_path):
    binary, log, real = logged_cli
    owner, name, workspace = start_owner(binary, apptainer_image[1], tmp_path / "ws", close=False)
    try:
        assert name in instance_names(real), "the instance runs while its owner lives"
        assert os.path.isdir(workspace)
        assert watchdogs_of(binary), "the owner started its watchdog"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    killed = time.monotonic()
    try:
        took = wait_for(lambda: name not in instance_names(real), 15)
        assert took is not None, "the instance outlived its SIGKILLed owner by 15 s"
        assert wait_for(lambda: not os.path.exists(workspace), 15 - took) is not None, "its workspace remains"
        assert wait_for(lambda: not watchdogs_of(binary), 10) is not None, "the watchdog exits when done"
        print(
            f"apptainer: instance gone {took:.2f}s, workspace gone {time.monotonic() - killed:.2f}s after the "
            "owner's SIGKILL"
        )
        assert stops_of(log, name) >= 1
    finally:
        subprocess.run([real, "instance", "stop", "--force", name], capture_output=True)
        shutil.rmtree(workspace, ignore_errors=True)


@pytest.mark.apptainer
def test_after_a_normal_close_the_watchdog_has_nothing_to_stop(apptainer_image, logged_cli, tmp_path):
    binary, log, real = logged_cli
    owner, name, workspace = start_owner(binary, apptainer_image[1], tmp_path / "ws", close=True)
    try:
        assert name not in instance_names(real), "close() stopped the instance"
        assert not os.path.exists(workspace), "close() removed the workspace"
        assert stops_of(log, name) == 1
        assert watchdogs_of(binary), "the watchdog waits for its owner"
    finally:
        owner.send_signal(signal.SIGKILL)  # no exit hook runs: any further stop would be the watchdog's
        owner.wait()
    assert wait_for(lambda: not watchdogs_of(binary), 10) is not None, "the watchdog exits at its owner's death"
    assert stops_of(log, name) == 1, "the instance was stopped exactly once, by close()"
    assert name not in instance_names(real)
