"""The package's version (``rollout --version``): its installed metadata, else the source tree's pyproject.toml."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

DIST = "rollout-farm"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def package_version() -> str:
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return pyproject_version(PYPROJECT) or "unknown"


def pyproject_version(path: Path) -> str | None:
    """``version`` of the ``[project]`` table (no TOML parser before Python 3.11: the table's lines)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    table = re.search(r"(?ms)^\[project\]\s*$(.*?)(?=^\[|\Z)", text)
    found = table and re.search(r"""(?m)^version\s*=\s*["']([^"']+)["']""", table.group(1))
    return found.group(1) if found else None
