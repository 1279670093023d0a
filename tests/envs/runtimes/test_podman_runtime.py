"""DockerRuntime with engine podman (its docker-compatible API): the contract, runaway commands, isolation."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import pytest
from runtime_helpers import container_runtime, podman_copy, run

from envs.runtimes.check import check_runtime
from envs.runtimes.docker.containers import remove_labelled
from envs.runtimes.docker.runtime import DockerRuntime
from rollout.errors import ContainerStartError

pytestmark = pytest.mark.podman


@pytest.fixture(scope="module")
def podman_image(podman_available, base_image) -> str:
    """The base image in podman's storage."""
    return podman_copy(base_image)


def runtime(image: str, run_id: str | None = None, **config) -> DockerRuntime:
    return container_runtime(image, "podman", run_id, **config)


def test_podman_runtime_passes_the_conformance_checker(podman_image):
    asyncio.run(check_runtime(lambda: runtime(podman_image, max_output_bytes=200_000)))


def test_runaway_commands_are_stopped_and_the_container_stays_usable(podman_image):
    async def scenario(rt):
        began = time.monotonic()
        sleeper = await rt.exec("sleep 10000 & setsid sleep 10001 & wait", timeout=3)
        seconds = time.monotonic() - began
        ps = (await rt.exec("ps -eo pid,stat,args")).output
        bomb = await rt.exec(":(){ :|:& };:; sleep 60", timeout=3)
        hog = await rt.exec('python3 -c "b = bytearray(8 << 30)"', timeout=30)
        for _ in range(20):  # the killed bomb's processes may take a moment to be reaped
            after = await rt.exec("echo alive")
            if after.output == "alive\n":
                break
            await asyncio.sleep(0.25)
        devices = (await rt.exec("cat /proc/net/dev")).output
        disk = await rt.exec("dd if=/dev/zero of=big bs=1M count=5000; stat -c %s big", timeout=120)
        return sleeper, seconds, ps, bomb, hog, after, devices, disk

    rt = runtime(podman_image, memory="256m", pids_limit=256, max_file_size="64m")
    sleeper, seconds, ps, bomb, hog, after, devices, disk = run(scenario, rt)
    assert sleeper.timed_out and 3 <= seconds < 3 + 2 + 5
    assert "sleep 1000" not in ps and " Z" not in ps, ps
    assert bomb.timed_out and "Resource temporarily unavailable" in bomb.output
    assert hog.returncode != 0 and ("MemoryError" in hog.output or "out of memory" in hog.output), hog
    assert after.output == "alive\n"
    assert [line.split(":")[0].strip() for line in devices.splitlines()[2:]] == ["lo"]
    assert "File size limit exceeded" in disk.output and disk.output.split()[-1] == str(64 << 20), disk


def test_podman_containers_are_labelled_and_collected(podman_image):
    run_id = f"test-{uuid.uuid4().hex[:8]}"

    async def scenario(rt):
        listed = subprocess.run(["podman", "ps", "--filter", f"label=rollout-farm.run={run_id}", "--format",
                                 "{{.Names}}"], capture_output=True, text=True).stdout.split()
        kept = remove_labelled(run_id=run_id, engine="podman")  # ours, and we are alive: kept
        removed = remove_labelled(run_id=run_id, engine="podman", include_live=True)
        return listed, kept, removed

    rt = runtime(podman_image, run_id=run_id)
    listed, kept, removed = run(scenario, rt)
    assert listed == [rt.name] and kept == [] and removed == [rt.name]


def test_missing_image_is_a_start_error(podman_available):
    rt = runtime("rollout-farm/no-such-image:never")
    with pytest.raises(ContainerStartError, match="no-such-image.*rollout images"):
        asyncio.run(rt.start())
