"""Names and paths that come from data: ids that are safe as file names, paths kept under a root.

A task id becomes a directory (``trajectories/<id>/``, ``logs/run_evaluation/<run>/<model>/<id>/``), a
container label and part of shell scripts; a dataset is input nobody vetted. So ids are checked when the
dataset loads, and every path built from data is checked to be under its root before anything is written
or deleted there.
"""

from __future__ import annotations

import re
from pathlib import Path

from rollout.errors import ConfigError

SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=@,:#~-]{0,199}")
SAFE_ID_RULE = ("1 to 200 letters, digits and . _ - + = @ , : # ~, starting with a letter, digit or _ "
                "(no / or \\, no spaces or control characters, not . or ..)")


def id_problem(value: object) -> str | None:
    """Why ``value`` cannot be a task id (a file name in a run directory), or None when it can."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {value!r}"
    if SAFE_ID.fullmatch(value) is None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        return f"{shown!r} is not a safe name: use {SAFE_ID_RULE}"
    return None


def name_problem(value: object) -> str | None:
    """Why ``value`` (a run id, a model name: the user's own, not a dataset's) cannot name one directory
    level, or None: it must be non-empty, not ``.`` or ``..``, without a path separator or control character."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {value!r}"
    if value in (".", "..") or "/" in value or "\\" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"{value[:80]!r} cannot name a directory (no / or \\, no control characters, not . or ..)"
    return None


class PathOutsideRoot(ConfigError, ValueError):
    """A path built from data resolves outside the directory it must stay in: bad data, refused (a ``ConfigError``;
    still a ``ValueError`` for callers that catch one)."""


def under(root: str | Path, path: str | Path, *, strict: bool = True) -> Path:
    """``path`` resolved (symlinks followed), checked to lie inside ``root`` (``strict=False``: or be it).

    Raises ``PathOutsideRoot`` otherwise: call it before writing or deleting anything whose path holds data.
    """
    base = Path(root).resolve()
    target = Path(path).resolve()
    if target == base and not strict or target != base and target.is_relative_to(base):
        return target
    raise PathOutsideRoot(f"{path} is not inside {root}; refusing to write or delete there")
