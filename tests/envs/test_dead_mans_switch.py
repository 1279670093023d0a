"""A container dies with the process that started it: SIGKILL the owner and its container is gone, with no
reaper, exit hook or TTL involved (docker, and podman through the same API)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid

import pytest

from envs.runtimes.docker_runtime import DockerRuntime

OWNER = """
import asyncio, gc, sys, time
from envs.runtimes.docker_runtime import DockerRuntime
engine, image, run_id = sys.argv[1:4]
runtime = DockerRuntime({"type": engine, "image": image}, run_id=run_id, rollout_id="owned")
asyncio.run(runtime.start())
gc.collect()  # nothing the switch needs may be left to the garbage collector
print(runtime.container_id, flush=True)
time.sleep(600)
"""


def container_exists(engine: str, container_id: str) -> bool:
    found = subprocess.run([engine, "ps", "-aq", "--no-trunc", "--filter", f"id={container_id}"],
                           capture_output=True, text=True, check=True)
    return bool(found.stdout.strip())


def gone_within(engine: str, container_id: str, seconds: float) -> float | None:
    """Seconds until the container is gone, or none if it is still there after ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if not container_exists(engine, container_id):
            return time.monotonic() - began
        time.sleep(0.1)
    return None


@pytest.fixture(params=["docker", pytest.param("podman", marks=pytest.mark.podman)])
def engine_image(request, base_image):
    engine = request.param
    if engine == "docker":
        request.getfixturevalue("docker_available")
    else:
        request.getfixturevalue("podman_available")
        if subprocess.run(["podman", "image", "exists", base_image]).returncode != 0:
            subprocess.run(["podman", "pull", "-q", f"docker-daemon:{base_image}"], check=True, capture_output=True)
    return engine, base_image


@pytest.mark.docker
def test_a_sigkilled_owners_container_is_gone_within_seconds(engine_image):
    engine, image = engine_image
    owner = subprocess.Popen([sys.executable, "-c", OWNER, engine, image, f"dms-{uuid.uuid4().hex[:8]}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    container_id = owner.stdout.readline().strip()
    try:
        assert container_id, owner.stderr.read()
        time.sleep(1)
        assert container_exists(engine, container_id), "the container runs while its owner lives"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    took = gone_within(engine, container_id, 10)
    if took is None:
        subprocess.run([engine, "rm", "-f", container_id], capture_output=True)
    assert took is not None, "the container outlived its SIGKILLed owner by 10 s"
    print(f"{engine}: container gone {took:.2f}s after its owner's SIGKILL")


@pytest.mark.docker
def test_close_still_removes_the_container_at_once(base_image):
    rt = DockerRuntime({"image": base_image}, run_id=f"dms-{uuid.uuid4().hex[:8]}", rollout_id="closed")

    async def scenario():
        await rt.start()
        alive = await rt.exec("echo alive")
        await rt.close()
        return alive

    assert asyncio.run(scenario()).output == "alive\n"
    assert not container_exists("docker", rt.container_id)
