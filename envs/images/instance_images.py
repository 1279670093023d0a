"""Per-instance images: ``FROM base``, a local repo or git bundle at ``base_commit`` in /testbed, built in parallel."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from envs.images.base_image import docker_build, ensure_image, image_present, last_lines
from envs.images.daemon import ImageError, docker_client
from envs.images.image_gc import LABEL, prune_instance_images, recently_used, record_use
from envs.images.image_names import DEFAULT_BASE_IMAGE, NAME_FIELDS, image_for, instance_id, instance_tag
from envs.images.sources import Slots, fetch_image
from envs.runtimes.output import decode
from envs.runtimes.past_repo import MissingCommit, fresh_repo_script, past_pack
from rollout.data.carried import local_path
from rollout.data.dataset import load_tasks
from rollout.errors import ConfigError, ContainerStartError
from rollout.records import Task

GIT_USER = ("rollout-farm agent", "agent@rollout-farm.invalid")


@dataclass
class BuildReport:
    """Per-instance image builds: ids built, already present (skipped), failed (id, error), and ignored
    (rows that name a prebuilt image or have no ``repo_path``)."""

    built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def build_instance_images(dataset_path: str | Path, base: str = DEFAULT_BASE_IMAGE, parallelism: int = 2,
                          force: bool = False, progress: Callable[[str], Any] = print,
                          network: bool = False, allow_outside_paths: bool = False) -> BuildReport:
    """Build ``FROM base`` an image per row with ``repo_path``: the repo at ``base_commit`` in /testbed,
    ``install_cmd`` run at build time (without network unless ``network``). Present images are skipped;
    a failed row is reported and the others go on. ``allow_outside_paths``: see ``rollout.data.dataset.load_tasks``."""
    if parallelism < 1:
        raise ConfigError(f"must be at least 1, got {parallelism}", "parallel")
    dataset_path = Path(dataset_path)
    tasks = load_tasks(dataset_path, allow_outside_paths=allow_outside_paths)
    report = BuildReport()
    # A row naming its image means a prebuilt one: never overwrite a user's tag.
    todo = [t for t in tasks if t.data.get("repo_path") and not any(t.data.get(k) for k in NAME_FIELDS)]
    order = {t.task_id: i for i, t in enumerate(todo)}
    report.ignored = [t.task_id for t in tasks if t.task_id not in order]
    if not todo:
        return report
    if not image_present(docker_client(), base):
        raise ImageError(f"base image {base} is missing: build it with `rollout images base`")
    root = dataset_path.resolve().parent
    with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="image-build") as pool:
        futures = {pool.submit(_build_one, task, root, base, force, network): task.task_id for task in todo}
        for done, future in enumerate(as_completed(futures), start=1):
            ident, where = futures[future], f"{done}/{len(todo)}"
            try:
                status, seconds = future.result()
            except Exception as exc:  # a bad row is data: report it, build the others
                report.failed.append((ident, str(exc)))
                progress(f"failed {where} ({ident}): {last_lines(str(exc), 5)}")
                continue
            if status == "built":
                report.built.append(ident)
                progress(f"built {where} ({ident}) in {seconds:.1f}s")
            else:
                report.skipped.append(ident)
                progress(f"skipped {where} ({ident}): present")
    for names in (report.built, report.skipped):
        names.sort(key=order.__getitem__)
    report.failed.sort(key=lambda item: order[item[0]])
    return report


def _build_one(task: Task, root: Path, base: str, force: bool, network: bool) -> tuple[str, float]:

    began = time.monotonic()
    tag = instance_tag(task, base)
    client = docker_client()  # one client per thread: the SDK's HTTP session is not meant to be shared
    if not force and image_present(client, tag):
        return "skipped", 0.0
    source = (root / local_path(str(task.data["repo_path"]))).resolve()  # a carried file fetched to this node
    commit = str(task.data.get("base_commit") or "")
    if not source.exists():
        raise ImageError(f"repo_path {source} does not exist")
    if not commit:
        raise ImageError("the row has repo_path but no base_commit")
    with tempfile.TemporaryDirectory(prefix="rollout-image-") as context:
        full = _prepare_repo(source, commit, Path(context, "testbed"))
        labels = {LABEL: instance_id(task), "rollout-farm.base-commit": full, "rollout-farm.base": base}
        Path(context, "Dockerfile").write_text(_dockerfile(base, full, task.data.get("install_cmd"), labels))
        try:
            docker_build(client, tag, path=context, rm=True, forcerm=True, nocache=force, pull=False,
                         network_mode=None if network else "none")
        finally:
            remove_leftovers(client, instance_id(task))
    return "built", time.monotonic() - began


def remove_leftovers(client: Any, ident: str) -> None:
    """Remove untagged images of one instance: the layers a failed build left, the image a forced
    rebuild replaced. Every layer carries the instance label, so nothing else is touched."""
    import docker

    for attempt in range(3):
        try:
            client.images.prune(filters={"dangling": True, "label": f"{LABEL}={ident}"})
            return
        except docker.errors.APIError:  # the daemon runs one prune at a time: a parallel build's may be running
            time.sleep(0.5 * (attempt + 1))
    # hygiene only: leftovers never fail a build


def _prepare_repo(source: Path, commit: str, dest: Path) -> str:
    """Make ``dest`` a new repository holding only ``commit``'s past (the source's past-only pack), checked out
    on the source's branch name, so the image holds no future history (no leaked fix): its full id."""
    try:
        past = past_pack(str(source), commit)
    except MissingCommit:
        raise ImageError(f"base_commit {commit} is not in {source}") from None
    except ContainerStartError as exc:
        raise ImageError(str(exc)) from None
    script = fresh_repo_script(past.pack, past.idx, str(dest), past)
    done = subprocess.run(["sh", "-c", script], capture_output=True, timeout=1800,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    if done.returncode != 0:
        raise ImageError(f"preparing {source} at {commit} failed: {last_lines(decode(done.stderr), 5)}")
    return past.commit


def _dockerfile(base: str, commit: str, install_cmd: Any, labels: dict[str, str]) -> str:
    name, email = GIT_USER
    lines = [
        f"FROM {base}",
        # Labels first, so every layer of this build can be found (and cleaned) by instance.
        "LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in labels.items()),
        "COPY testbed /testbed",
        "WORKDIR /testbed",
        # --system so any user in the container can commit; the check fails the build on a wrong checkout.
        (f'RUN git config --system user.name "{name}" && git config --system user.email {email}'
         " && git config --system --add safe.directory '*'"
         f' && test "$(git rev-parse HEAD)" = {commit} && git status --short > /dev/null'),
    ]
    if install_cmd:
        lines.append("RUN " + json.dumps(["bash", "-lc", str(install_cmd)]))
    return "\n".join(lines) + "\n"


MAX_PARALLEL_BUILDS = 2
"""Builds at a time in one process (``ensure_instance_image``): a node running rollouts of many instances
builds two images at a time, not dozens; the others wait their turn."""
RECENT_USE_KEEP = 300.0
"""Seconds after its last use an image is kept by pruning after a build, so an image just returned to
a rollout is not removed before the rollout's container exists (a container keeps it from then on)."""

_node_budget: int | None = None


def set_node_budget(budget_bytes: int | None) -> None:
    """The disk this node's instance images may take when a caller names no budget (a farm's
    ``images.node_disk_budget``, installed in each worker)."""
    global _node_budget
    _node_budget = budget_bytes


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_build_slots = Slots(MAX_PARALLEL_BUILDS)


def ensure_instance_image(task: Task, base: str = DEFAULT_BASE_IMAGE, network: bool = False,
                          budget_bytes: int | None = None) -> str:
    """The task's image tag, built now if it is missing and the row can be built (``repo_path``);
    otherwise found or pulled by ``ensure_image`` (an ``ImageError`` naming it when neither works).
    Concurrent rollouts of one instance in this process build it once, and at most ``MAX_PARALLEL_BUILDS``
    images build at a time. After a build or a fetch, with ``budget_bytes`` (default: the node's,
    ``set_node_budget``), the least recently used instance images are removed until they fit it (never the new
    one, one used in the last ``RECENT_USE_KEEP`` seconds, or one a container uses)."""
    tag = image_for(task, base)
    budget_bytes = budget_bytes if budget_bytes is not None else _node_budget
    with _locks_guard:
        lock = _locks.setdefault(tag, threading.Lock())
    with lock:
        client = docker_client()
        try:
            added = _ensure_locked(task, tag, base, network, client)
        except OSError as exc:  # the SDK's transport and API errors are OSErrors (requests'), as a missing file is
            if daemon_answers(client):
                raise
            raise ImageError(f"the docker daemon stopped answering while {tag} was prepared: {exc}",
                             retryable=True) from exc
    if added and budget_bytes is not None:
        try:
            prune_instance_images(budget_bytes, client=client, keep={tag} | recently_used(RECENT_USE_KEEP))
        except Exception as exc:  # the image is built: a failed clean-up must not fail the rollout
            print(f"pruning instance images failed: {exc}")
    return tag


def _ensure_locked(task: Task, tag: str, base: str, network: bool, client: Any) -> bool:
    """``ensure_instance_image``'s work under the tag's lock; whether the node's images grew (built here or
    fetched)."""
    added = not image_present(client, tag)
    # a registry's layers first (the node may hold the base already); then a build here from the repository
    if added and fetch_image(tag, client, layered_only=True) is None:
        if task.data.get("repo_path") and not any(task.data.get(k) for k in NAME_FIELDS):
            if not image_present(client, base):
                ensure_image(base, client)
            with _build_slots:
                _build_one(task, Path("/"), base, False, network)
        else:
            ensure_image(tag, client)
    record_use(tag)
    return added


def daemon_answers(client: Any) -> bool:
    """Whether the docker daemon answers a ping now (an error while it does not is the daemon's, not the task's)."""
    try:
        client.ping()
    except Exception:  # noqa: BLE001 - any failure to answer is "no"
        return False
    return True
