"""The image a Harbor task runs in: ``docker_image`` when this machine has it, else built from the task's
``environment/`` (a Dockerfile, or a compose file whose one service is ``main``) and tagged by the content of
that directory, so an unchanged environment is built once per machine and a changed one gets a new tag.

A ``FROM`` image this machine lacks is a clear error naming it (the build would otherwise try a registry, and
hang or fail late). Compose files with services besides ``main`` are refused: the runtime runs one container.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from envs.harbor.archive import task_files
from envs.images.base_image import DEFAULT_BASE_IMAGE, docker_build, ensure_image, image_present
from envs.images.daemon import ImageError, docker_client
from envs.images.image_names import sanitise_tag
from envs.images.sources import fetch_image

REPOSITORY = "rollout-farm/harbor"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


@dataclass
class Plan:
    image: str
    """What the task runs: ``docker_image`` when given, else the built tag."""
    build: str | None
    """The tag a build from ``environment/`` makes, or None (no Dockerfile)."""
    dockerfile: str | None = None
    """The Dockerfile's path inside the task's archive."""
    context: str | None = None
    """The build context's folder inside the task's archive."""


def environment_plan(task_dir: Path, config: Any) -> Plan:
    """How ``task_dir`` gets its image (a ``ValueError`` says why it cannot)."""
    env_dir = task_dir / "environment"
    context, dockerfile = "environment", "environment/Dockerfile"
    compose = next((env_dir / n for n in COMPOSE_FILES if (env_dir / n).is_file()), None)
    if compose is not None:
        context, dockerfile, image = _compose_main(compose, task_dir)
        if image and not config.docker_image:
            config.docker_image = image
    has_dockerfile = dockerfile is not None and (task_dir / dockerfile).is_file()
    if not has_dockerfile and not config.docker_image:
        raise ValueError("no environment/Dockerfile, compose build or docker_image: nothing to run the task in")
    tag = None
    if has_dockerfile:
        digest = hashlib.sha256()
        for path in sorted((task_dir / context).rglob("*")):
            if path.is_file():
                digest.update(path.relative_to(task_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        digest.update(dockerfile.encode())
        tag = f"{REPOSITORY}:{sanitise_tag(task_dir.name)[:80]}-{digest.hexdigest()[:12]}"
    return Plan(config.docker_image or tag, tag, dockerfile if has_dockerfile else None, context)


def _compose_main(compose: Path, task_dir: Path) -> tuple[str, str | None, str | None]:
    try:
        spec = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{compose.name} does not parse: {exc}") from None
    services = spec.get("services") if isinstance(spec, dict) else None
    if not isinstance(services, dict) or "main" not in services:
        raise ValueError(f"{compose.name} has no 'main' service")
    others = sorted(set(services) - {"main"})
    if others:
        raise ValueError(f"{compose.name} defines services besides main ({', '.join(others)}): the runtime here runs "
                         "one container per rollout, so multi-service tasks are not supported")
    main = services["main"] or {}
    build = main.get("build")
    image = main.get("image") if isinstance(main.get("image"), str) else None
    if build is None:
        return "environment", None, image
    ctx, file = (build, "Dockerfile") if isinstance(build, str) else (build.get("context", "."),
                                                                     build.get("dockerfile", "Dockerfile"))
    context = posixpath.normpath(posixpath.join("environment", str(ctx)))
    dockerfile = posixpath.normpath(posixpath.join(context, str(file)))
    for name in (context, dockerfile):
        if name.startswith("..") or posixpath.isabs(name) or (task_dir / name).resolve() != task_dir.resolve() / name:
            raise ValueError(f"{compose.name}: main.build {name!r} leads out of the task directory")
    return context, dockerfile, image


def from_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds ``FROM`` that are not its own stages (``ARG`` defaults substituted)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    out = []
    text = re.sub(r"\\\r?\n", " ", dockerfile)
    for line in text.splitlines():
        words = line.strip().split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "ARG" and len(words) > 1 and "=" in words[1]:
            key, _, value = words[1].partition("=")
            args.setdefault(key, value.strip("\"'"))
        elif words[0].upper() == "FROM":
            rest = [w for w in words[1:] if not w.startswith("--")]
            if not rest:
                continue
            image = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), rest[0])
            if image.lower() != "scratch" and image not in stages:
                out.append(image)
            if len(rest) >= 3 and rest[1].upper() == "AS":
                stages.add(rest[2])
    return out


_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def ensure_task_image(harbor: dict[str, Any], files: Any, *, timeout: float = 600.0,
                      log: Callable[[str], Any] | None = None) -> str:
    """The image the task runs in, on this machine: ``docker_image`` if present, else built once per tag
    (concurrent rollouts of one task wait for the one build). An ``ImageError`` names what is missing."""
    image, tag = harbor["image"], harbor.get("build")
    client = docker_client()
    if image != tag and image_present(client, image):
        return image
    if tag is None:
        ensure_image(image, client)
        return image
    with _guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        if not image_present(client, tag):
            build_image(tag, files, harbor["dockerfile"], harbor["context"], timeout=timeout, log=log)
    return tag


def build_image(tag: str, files: Any, dockerfile: str, context: str, *, timeout: float = 600.0,
                log: Callable[[str], Any] | None = None, nocache: bool = False) -> float:
    """Build ``tag`` from the archive's ``context`` folder; the seconds it took."""

    began = time.monotonic()
    client = docker_client()
    text = files.text(dockerfile) or ""
    missing = [i for i in from_images(text) if "$" in i or not (image_present(client, i) or _brought(i, client))]
    if missing:
        raise ImageError(f"{dockerfile}: FROM {missing[0]} is not an image of this machine (no registry is asked): "
                         f"`docker load` or build it first, or give the task an environment.docker_image it has")
    body = files.tar_of(context)
    rel = posixpath.relpath(dockerfile, context)
    if log:
        log(f"building {tag} ({len(body) >> 10} kB context)")
    docker_build(client, tag, fileobj=io.BytesIO(body), custom_context=True, dockerfile=rel, rm=True, forcerm=True,
                 pull=False, labels={"rollout-farm.harbor": "1"}, nocache=nocache, timeout=int(timeout) + 30)
    return time.monotonic() - began


def _brought(image: str, client: Any) -> bool:
    """Whether ``image`` could be made present without asking a registry the farm was not given: the farm's base
    image (built here, or fetched from the farm), or one an installed source (the run's registry, the driver's
    image depot) holds."""
    if image == DEFAULT_BASE_IMAGE:
        ensure_image(image, client)
        return True
    return fetch_image(image, client) is not None


def image_workdir(image: str) -> str | None:
    """The image's own ``WORKDIR`` (where the task's commands start when task.toml names none), or None."""
    try:
        return docker_client().api.inspect_image(image)["Config"].get("WorkingDir") or None
    except Exception:  # noqa: BLE001 - the container start says what is wrong with the image
        return None


def build_task_images(tasks: list[Any], *, parallel: int = 2, force: bool = False,
                      log: Callable[[str], Any] = print) -> tuple[list[str], list[tuple[str, str]]]:
    """Every task's image built ahead (``rollout images build DIR``), ``parallel`` at a time, a line per task as it
    ends; (the images the tasks run, the (task, error) of those that failed)."""

    def one(task: Any) -> tuple[str, str]:
        harbor = task.data["harbor"]
        tag = harbor.get("build")
        client = docker_client()
        if tag is None or (not force and image_present(client, tag)):
            image = ensure_task_image(harbor, None) if tag is None else tag
            return image, "present"
        seconds = build_image(tag, task_files(task.data["task_archive"]), harbor["dockerfile"], harbor["context"],
                              nocache=force)
        return tag, f"built in {seconds:.1f}s"

    images, failed, done = [], [], 0
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {pool.submit(one, task): task for task in tasks}
        for future in as_completed(futures):
            task, done = futures[future], done + 1
            try:
                image, what = future.result()
            except ImageError as exc:
                failed.append((task.task_id, str(exc)))
                log(f"[{done}/{len(tasks)}] {task.task_id}: failed: {str(exc).splitlines()[0]}")
                continue
            images.append(image)
            log(f"[{done}/{len(tasks)}] {task.task_id}: {image} {what}")
    return images, failed
