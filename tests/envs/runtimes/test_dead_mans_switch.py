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
from runtime_helpers import podman_copy

from envs.runtimes.docker.runtime import DockerRuntime

OWNER = """
import asyncio, gc, sys, time
from envs.runtimes.docker.runtime import DockerRuntime
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
        podman_copy(base_image)
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


CREATOR = """
import sys, time
import docker
from envs.runtimes.docker import containers
from envs.runtimes.docker.owner_watch import WITH_OWNER_LABEL, ensure_watchdog
image, run_id = sys.argv[1:3]
ensure_watchdog("docker", None)
api = docker.from_env().api
ids = []
for with_owner in (True, False):  # created, never started: the window between create and start
    labels = {containers.RUN_LABEL: run_id, **containers.owner_labels(), \
**({WITH_OWNER_LABEL: "1"} if with_owner else {})}
    ids.append(api.create_container(image, ["sleep", "600"], labels=labels)["Id"])
print(*ids, flush=True)
time.sleep(600)
"""


@pytest.mark.docker
def test_a_container_created_but_not_started_goes_with_its_sigkilled_owner(base_image):
    owner = subprocess.Popen([sys.executable, "-c", CREATOR, base_image, f"dms-{uuid.uuid4().hex[:8]}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = owner.stdout.readline().split()
    try:
        assert len(line) == 2, owner.stderr.read()
        doomed, kept = line
        time.sleep(1)
        assert container_exists("docker", doomed) and container_exists("docker", kept)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    took = gone_within("docker", doomed, 10)
    still = container_exists("docker", kept)
    subprocess.run(["docker", "rm", "-f", *line], capture_output=True)
    assert took is not None, "a created container of a die-with-owner runtime outlived its owner's SIGKILL by 10 s"
    assert still, "a container without die_with_owner is left for `rollout gc`"
    print(f"created, never started: gone {took:.2f}s after its owner's SIGKILL")
