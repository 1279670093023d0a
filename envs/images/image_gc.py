"""A disk budget for per-instance images: the least recently used ones are removed beyond it.

A node builds each instance image on first use; over a long run that is one image per instance seen,
which fills the disk. ``prune_instance_images`` removes the least recently used (use recorded in this
process by ``record_use``, else the image's creation time) until the instance images fit the budget.
An image a container uses (running or not), one in ``keep``, and any image without the instance label
(the base image among them) is never removed.

Sizes are what removing an image frees: its layers not shared with another image, so the base layers
every instance image is built on count once, outside the budget (``docker system df`` calls this the
unique size).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection

from envs.images.daemon import ImageError, docker_client

LABEL = "rollout-farm.instance"
"""The label on every per-instance image (its value is the instance id); nothing else is a candidate."""

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}

_last_used: dict[str, float] = {}
_used_guard = threading.Lock()
_prune_lock = threading.Lock()  # one prune at a time per process: two would work from the same stale sizes


def parse_size(text: str | int) -> int:
    """Bytes in ``"20G"``, ``"500M"``, ``"1.5GB"``, ``"8GiB"``, ``"1024"`` or an int. K/M/G/T are
    powers of 1000 (as docker prints sizes), Ki/Mi/Gi/Ti powers of 1024; a trailing ``B`` is optional."""
    if isinstance(text, bool):  # an int subclass, never a size
        raise ValueError(f"not a size: {text!r} (use e.g. 500M, 20G, 1.5GB, or bytes)")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"not a size: {text!r} (must not be negative)")
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?)?b?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M, 20G, 1.5GB, or bytes)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def format_size(size: int) -> str:
    """``1234567`` → ``"1.2 MB"``: powers of 1000, as docker prints sizes."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def record_use(tag: str, when: float | None = None) -> None:
    """Remember that ``tag`` was used now (or at ``when``, a Unix time): pruning removes it after the
    images used longer ago. Process memory only: another process sees the image's creation time."""
    with _used_guard:
        _last_used[tag] = time.time() if when is None else when


def recently_used(within: float) -> set[str]:
    """The tags this process recorded a use of in the last ``within`` seconds."""
    since = time.time() - within
    with _used_guard:
        return {tag for tag, when in _last_used.items() if when >= since}


@dataclass
class InstanceImage:
    """One instance image as pruning sees it."""

    id: str
    tags: list[str]
    size: int
    """Bytes removing it frees: its layers no other image shares."""
    last_used: float
    """Unix time: the latest recorded use of any of its tags, else its creation time."""
    containers: int
    """Containers (running or not) created from it: while any exist it is never removed."""


def list_instance_images(client: Any = None, match: Callable[[str], bool] | None = None) -> list[InstanceImage]:
    """Tagged images with the instance label, least recently used first; only those whose every tag
    passes ``match`` when given. Untagged ones (layers of a build in progress, leftovers) are left out."""
    import docker

    client = client or docker_client()
    try:
        usage = client.df()  # the only API that reports shared sizes
        used_by = {}
        for container in client.api.containers(all=True):
            used_by[container.get("ImageID")] = used_by.get(container.get("ImageID"), 0) + 1
    except docker.errors.APIError as exc:
        raise ImageError(f"cannot list images and containers: {exc}", retryable=True) from None
    with _used_guard:
        recorded = dict(_last_used)
    images = []
    for entry in usage.get("Images") or []:
        tags = [t for t in entry.get("RepoTags") or [] if t != "<none>:<none>"]
        if LABEL not in (entry.get("Labels") or {}) or not tags:
            continue
        if match is not None and not all(match(t) for t in tags):
            continue
        uses = [recorded[t] for t in tags if t in recorded]
        shared = max(int(entry.get("SharedSize") or 0), 0)  # -1: not computed
        images.append(InstanceImage(
            id=entry["Id"], tags=sorted(tags), size=max(int(entry.get("Size") or 0) - shared, 0),
            last_used=max(uses) if uses else float(entry.get("Created") or 0),
            containers=max(int(entry.get("Containers") or 0), used_by.get(entry["Id"], 0)),
        ))
    images.sort(key=lambda image: (image.last_used, image.tags))
    return images


def prune_instance_images(budget_bytes: int, *, client: Any = None, keep: Collection[str] = frozenset(),
                          match: Callable[[str], bool] | None = None, dry_run: bool = False,
                          log: Callable[[str], Any] = print) -> list[str]:
    """While the instance images (those whose tags pass ``match``, when given) take more than
    ``budget_bytes``, remove the least recently used one. Never one with a tag in ``keep`` nor one a
    container uses; when only those are left the budget is exceeded, and said. Returns the tags removed
    (with ``dry_run``: that would be removed, nothing is)."""
    import docker

    if budget_bytes < 0:
        raise ValueError(f"the budget must not be negative, got {budget_bytes}")
    client = client or docker_client()
    keep = set(keep)
    removed: list[str] = []
    with _prune_lock:
        images = list_instance_images(client, match)
        total = sum(image.size for image in images)
        for image in images:
            if total <= budget_bytes:
                break
            if image.containers or keep.intersection(image.tags):
                continue
            if not dry_run:
                try:
                    for tag in image.tags:  # the last tag's removal deletes the image
                        client.api.remove_image(tag)
                except docker.errors.ImageNotFound:
                    pass  # another process removed it first: its space is free all the same
                except docker.errors.APIError as exc:  # a container was created from it just now, most likely
                    log(f"kept {', '.join(image.tags)}: {getattr(exc, 'explanation', None) or exc}")
                    continue
            total -= image.size
            removed.extend(image.tags)
            log(f"{'would remove' if dry_run else 'removed'} {', '.join(image.tags)} ({format_size(image.size)})")
        if total > budget_bytes:
            log(f"instance images take {format_size(total)}, over the budget of {format_size(budget_bytes)}: "
                "the rest are in use or kept")
    if not dry_run:
        with _used_guard:
            for tag in removed:
                _last_used.pop(tag, None)
    return removed
