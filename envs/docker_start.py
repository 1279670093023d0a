"""Creating a container: its readable name, ulimits, start errors that say what to do, quiet removal."""

from __future__ import annotations

import re
import secrets
from typing import Any

from envs.engines import explain, status
from rollout.errors import ContainerStartError


def container_name(run_id: str, rollout_id: str) -> str:
    def clean(part: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_.-]+", "-", part).strip("-.")[:40] or "x"

    return f"rf-{clean(run_id)}-{clean(rollout_id)}-{secrets.token_hex(3)}"


def ulimit(name: str, value: int | str) -> Any:
    import docker

    soft, _, hard = str(value).partition(":")
    return docker.types.Ulimit(name=name, soft=int(soft), hard=int(hard or soft))


def start_error(exc: BaseException, image: str, engine: str) -> ContainerStartError:
    if isinstance(exc, ContainerStartError):
        return exc
    if status(exc) == 404 and "image" in str(exc).lower():
        return ContainerStartError(
            f"image {image!r} not found in {engine}: build it with `rollout images base` (the base image) or "
            f"`rollout images build` (task images), or set runtime.pull=missing to pull it from a registry",
            False,
        )
    return ContainerStartError(f"cannot start a {engine} container from {image!r}: {explain(exc)}")


def quiet_remove(api: Any, container_id: str) -> None:
    try:
        api.remove_container(container_id, force=True)
    except Exception:  # noqa: BLE001 - already gone (auto-remove) or being removed: the goal is reached
        pass
