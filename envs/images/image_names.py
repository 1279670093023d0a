"""Image names for tasks: a name the row gives, our deterministic per-instance tag, or SWE-bench's name."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

DEFAULT_BASE_IMAGE = "rollout-farm/base:bookworm"
INSTANCE_REPOSITORY = "rollout-farm/instance"
# Bump when the per-instance Dockerfile changes, so images built by an older recipe are rebuilt.
RECIPE_VERSION = "1"
NAME_FIELDS = ("image_name", "docker_image")
ID_FIELDS = ("instance_id", "task_id", "id")
HASH_LENGTH = 12
MAX_TAG_LENGTH = 128  # docker's limit for the part after the colon


def image_for(row: Any, base: str = DEFAULT_BASE_IMAGE) -> str:
    """The image a task runs in. ``row`` is a dataset row, a ``Task.data`` dict, or a ``Task``.

    1. ``image_name`` / ``docker_image`` when present (a prebuilt image, used as given);
    2. with ``repo_path``: ``rollout-farm/instance:<id>-<hash>``, the tag ``build_instance_images``
       builds (the hash covers the instance id, base_commit, install_cmd and ``base``);
    3. otherwise SWE-bench's ``swebench/sweb.eval.x86_64.<id, "__" as "_1776_">:latest``.
    """
    data = _fields(row)
    for key in NAME_FIELDS:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    if data.get("repo_path"):
        return instance_tag(data, base)
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


def _fields(row: Any) -> Mapping[str, Any]:
    """A dict row as is; a ``Task`` as its data plus its id (flat SWE rows keep instance_id in data)."""
    if isinstance(row, Mapping):
        return row
    data = dict(getattr(row, "data", None) or {})
    task_id = getattr(row, "task_id", None)
    if task_id is not None:
        data.setdefault("task_id", task_id)
    return data
