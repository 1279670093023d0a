"""What the runtime tests share: a container runtime on docker or podman with a run id of its own, a scenario run on a
started runtime of any kind (closed whatever happens), docker's image copied into podman's storage, and the host's
processes by their command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from typing import Any, Awaitable, Callable

from envs.runtimes.docker.runtime import DockerRuntime


def container_runtime(image: str, engine: str = "docker", run_id: str | None = None, **config: Any) -> DockerRuntime:
    """A ``DockerRuntime`` of ``image`` on ``engine`` (docker, or podman through its docker-compatible API)."""
    section = {"image": image, **config} if engine == "docker" else {"type": engine, "image": image, **config}
    return DockerRuntime(section, run_id=run_id or f"test-{uuid.uuid4().hex[:8]}", rollout_id=engine)


def run(scenario: Callable[[Any], Awaitable[Any]], rt: Any) -> Any:
    """Start ``rt`` (any runtime), run ``scenario(rt)``, and close it whatever happens."""

    async def main():
        await rt.start()
        try:
            return await scenario(rt)
        finally:
            await rt.close()

    return asyncio.run(main())


def podman_copy(image: str) -> str:
    """``image`` of docker's storage in podman's too (no registry here), copied once."""
    if subprocess.run(["podman", "image", "exists", image]).returncode != 0:
        subprocess.run(["podman", "pull", "-q", f"docker-daemon:{image}"], check=True, capture_output=True)
    return image


def processes_with(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (zombies have an empty one)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


async def survivors(text: str, seconds: float = 5.0) -> list[int]:
    """The processes with ``text`` still there ``seconds`` after a kill: a SIGKILLed process may need a moment to leave
    the process table (longer on a loaded machine)."""
    for _ in range(int(seconds / 0.02)):
        if not processes_with(text):
            return []
        await asyncio.sleep(0.02)
    return processes_with(text)
