"""Which engines can limit a container's disk (read from the engine's info), what a container gets on this
engine (the limit, or one warning saying why not), and size strings."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import uuid

import pytest

from envs.runtimes.docker import start as docker_start
from envs.runtimes.docker.runtime import DockerRuntime
from envs.runtimes.docker.start import disk_limit_unsupported, is_disk_refusal, size_bytes


def info(driver: str, backing: str | None = None) -> dict:
    status = [["Supports d_type", "true"]] + ([["Backing Filesystem", backing]] if backing else [])
    return {"Driver": driver, "DriverStatus": status}


@pytest.mark.parametrize("engine_info", [info("overlay2", "xfs"), info("overlay", "xfs"), info("devicemapper"),
                                         info("btrfs", "btrfs"), info("zfs", "zfs")])
def test_drivers_that_take_a_size_are_used(engine_info):
    assert disk_limit_unsupported(engine_info) is None


@pytest.mark.parametrize("engine_info, named", [(info("overlay2", "extfs"), "overlay2 on extfs"),
                                                (info("vfs", "extfs"), "vfs on extfs"),
                                                (info("overlay2"), "overlay2"), ({}, "unknown")])
def test_drivers_that_cannot_are_skipped_with_the_reason(engine_info, named):
    why = disk_limit_unsupported(engine_info)
    assert why is not None and named in why and "xfs with pquota" in why


def test_the_engines_refusal_is_recognised():
    refusal = "--storage-opt is supported only for overlay over xfs with 'pquota' mount option"
    assert is_disk_refusal(RuntimeError(refusal))
    assert not is_disk_refusal(RuntimeError("No such image: x"))


@pytest.mark.parametrize("text, value", [("64m", 64 << 20), ("1g", 1 << 30), ("512", 512), ("4K", 4096),
                                         ("10b", 10)])
def test_size_strings(text, value):
    assert size_bytes(text) == value


@pytest.mark.docker
def test_this_engine_gives_the_disk_limit_or_says_once_why_not(base_image, monkeypatch, caplog):
    import docker

    monkeypatch.setattr(docker_start, "_disk_support", {})  # as in a fresh process
    runtimes = [DockerRuntime({"image": base_image, "disk": "2g"}, run_id=f"test-{uuid.uuid4().hex[:8]}",
                              rollout_id=f"disk{k}") for k in range(3)]

    async def scenario():  # a run's first containers start side by side
        await asyncio.gather(*(rt.start() for rt in runtimes))
        try:
            return [docker.from_env().api.inspect_container(rt.container_id)["HostConfig"].get("StorageOpt")
                    for rt in runtimes]
        finally:
            for rt in runtimes:
                await rt.close()

    with caplog.at_level(logging.WARNING, logger="envs.runtimes.docker.start"):
        storage = asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if "runtime.disk" in r.getMessage()]
    why = disk_limit_unsupported(docker.from_env().api.info())
    if why is None and not warnings:
        assert storage == [{"size": "2g"}] * 3
    else:
        assert storage == [None] * 3 and len(warnings) == 1, warnings
        assert "no per-container disk limit" in warnings[0] and "max_file_size" in warnings[0]


START_ONE = """
import asyncio, sys
from envs.runtimes.docker.runtime import DockerRuntime

async def main():
    rt = DockerRuntime({"image": sys.argv[1], "disk": "2g"}, run_id=sys.argv[2], rollout_id="disk")
    await rt.start()
    await rt.close()

asyncio.run(main())
"""


@pytest.mark.docker
def test_the_processes_of_one_run_on_one_machine_say_it_once_between_them(base_image):
    """A run's worker processes on one node share a note scope (``NOTE_SCOPE_ENV``, set by the farm): the first
    says why there is no disk limit, the others do not; another run (scope) says it again."""
    import docker

    if disk_limit_unsupported(docker.from_env().api.info()) is None:
        pytest.skip("this engine limits a container's disk: there is nothing to say")
    run_id = f"test-{uuid.uuid4().hex[:8]}"

    def stderr_of_processes(scope: str, count: int) -> str:
        env = {**os.environ, docker_start.NOTE_SCOPE_ENV: scope}
        procs = [subprocess.Popen([sys.executable, "-c", START_ONE, base_image, run_id], env=env, text=True,
                                  stderr=subprocess.PIPE) for _ in range(count)]
        outs = [proc.communicate(timeout=120)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * count, outs
        return "".join(outs)

    scope = f"{run_id}@test:{uuid.uuid4().hex}"
    assert stderr_of_processes(scope, 3).count("no per-container disk limit (runtime.disk)") == 1
    assert stderr_of_processes(scope + "-next", 1).count("no per-container disk limit (runtime.disk)") == 1
