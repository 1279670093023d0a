"""Image names for tasks: a name the row gives, our deterministic per-instance tag, or the name its benchmark
publishes (SWE-bench's, SWE-smith's per repository snapshot, SWE-Gym's)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from rollout.records import Task

DEFAULT_BASE_IMAGE = "rollout-farm/base:bookworm"
INSTANCE_REPOSITORY = "rollout-farm/instance"
# Bump when the per-instance Dockerfile changes, so images built by an older recipe are rebuilt.
RECIPE_VERSION = "1"
NAME_FIELDS = ("image_name", "docker_image", "image")
"""Fields naming a prebuilt image (``image``: SWE-bench 5.x rows), used as given and never built here."""
SWE_GYM_REPOS = frozenset(r.lower() for r in (
    "getmoto/moto", "pandas-dev/pandas", "python/mypy", "dask/dask", "Project-MONAI/MONAI", "iterative/dvc",
    "pydantic/pydantic", "conan-io/conan", "facebookresearch/hydra", "bokeh/bokeh", "modin-project/modin"))
"""The repositories of SWE-Gym: its rows follow SWE-bench's schema, and their images are SWE-Gym's."""
SWESMITH_PREFIX = "swesmith/"
ID_FIELDS = ("instance_id", "task_id", "id")
HASH_LENGTH = 12
MAX_TAG_LENGTH = 128  # docker's limit for the part after the colon


def image_for(row: Any, base: str = DEFAULT_BASE_IMAGE) -> str:
    """The image a task runs in. ``row`` is a dataset row, a ``Task.data`` dict, or a ``Task``.

    1. ``image_name`` / ``docker_image`` when present (a prebuilt image, used as given);
    2. with ``repo_path``: ``rollout-farm/instance:<id>-<hash>``, the tag ``build_instance_images``
       builds (the hash covers the instance id, base_commit, install_cmd and ``base``);
    3. a SWE-smith row: the image of its repository snapshot, ``swebench/swesmith.x86_64.<owner>_1776_<repo>.<commit>``;
    4. a SWE-Gym row: ``xingyaoww/sweb.eval.x86_64.<id, "__" as "_s_">:latest``;
    5. otherwise SWE-bench's ``swebench/sweb.eval.x86_64.<id, "__" as "_1776_">:latest``.
    """
    data = _fields(row)
    for key in NAME_FIELDS:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    if data.get("repo_path"):
        return instance_tag(data, base)
    snapshot = swesmith_snapshot(data)
    if snapshot is not None:
        return swesmith_name(snapshot)
    if is_swegym(data):
        return swegym_name(instance_id(data))
    return swebench_name(instance_id(data))


def instance_tag(row: Any, base: str = DEFAULT_BASE_IMAGE) -> str:
    """Our per-instance tag: readable id, then a short hash of everything the image's content depends on.

    The repo path is not in the hash: ``base_commit`` already names the content, so moving the
    dataset does not orphan its images. The raw id is, so two ids that sanitise alike never share a tag.
    """
    data = _fields(row)
    ident = instance_id(data)
    identity = [RECIPE_VERSION, ident, str(data.get("base_commit") or ""), str(data.get("install_cmd") or ""), base]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:HASH_LENGTH]
    readable = sanitise_tag(ident)[: MAX_TAG_LENGTH - HASH_LENGTH - 1].rstrip(".-") or "instance"
    return f"{INSTANCE_REPOSITORY}:{readable}-{digest}"


def swebench_name(ident: str) -> str:
    """``django__django-11099`` → ``swebench/sweb.eval.x86_64.django_1776_django-11099:latest``."""
    return f"swebench/sweb.eval.x86_64.{ident.replace('__', '_1776_')}:latest".lower()


def swesmith_snapshot(row: Any) -> str | None:
    """``<owner>__<repo>.<commit8>`` of a SWE-smith row (its ``repo`` is ``swesmith/`` and that; its instance id
    that, a dot, and the bug's name), or None for any other row."""
    data = _fields(row)
    repo = str(data.get("repo") or "")
    if repo.startswith(SWESMITH_PREFIX):
        key = repo[len(SWESMITH_PREFIX):]
    elif not data.get("base_commit") and not data.get("test_patch"):
        ident = next((str(data[k]) for k in ID_FIELDS if data.get(k) is not None), "")
        key = ident.rsplit(".", 1)[0] if "." in ident else ""
    else:
        return None
    owner, _, rest = key.partition("__")
    name, _, commit = rest.rpartition(".")
    return key if owner and name and re.fullmatch(r"[0-9a-f]{8}", commit) else None


def swesmith_name(snapshot: str) -> str:
    """``owner__repo.1a2b3c4d`` → ``swebench/swesmith.x86_64.owner_1776_repo.1a2b3c4d`` (SWE-smith's profile name)."""
    return f"swebench/swesmith.x86_64.{snapshot.replace('__', '_1776_', 1)}".lower()


def is_swegym(row: Any) -> bool:
    return str(_fields(row).get("repo") or "").lower() in SWE_GYM_REPOS


def swegym_name(ident: str) -> str:
    """``getmoto__moto-5406`` → ``xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5406:latest``."""
    return f"xingyaoww/sweb.eval.x86_64.{ident.replace('__', '_s_')}:latest".lower()


def sanitise_tag(text: str) -> str:
    """Lower-case, characters outside ``[a-z0-9_.-]`` as ``-``, no leading ``.``/``-`` (docker refuses those)."""
    cleaned = re.sub(r"[^a-z0-9_.-]+", "-", text.lower())
    return cleaned.lstrip(".-")


def instance_id(row: Any) -> str:
    data = _fields(row)
    for key in ID_FIELDS:
        value = data.get(key)
        if value is not None and str(value):
            return str(value)
    raise ValueError(f"a task row needs one of {', '.join(ID_FIELDS)} to name its image")


def is_instance_tag(image: str) -> bool:
    return image.startswith(INSTANCE_REPOSITORY + ":")


def _fields(row: Mapping[str, Any] | Task) -> Mapping[str, Any]:
    """A dict row as is; a ``Task`` as its data plus its id (flat SWE rows keep instance_id in data)."""
    if isinstance(row, Mapping):
        return row
    data = dict(row.data)
    data.setdefault("task_id", row.task_id)
    return data
