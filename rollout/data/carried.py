"""Files a task carries to whichever machine runs it.

A dataset's path fields (``rollout.data.dataset.PATH_FIELDS``: a repo bundle) name a file on the machine that
loaded the dataset. A farm spread over machines replaces each with a reference to the file's content,
``carried:sha256:<hex>/<name>``, and the process that runs the task turns the reference back into a file of its
own machine with ``local_path``, through the fetcher its host installed (``set_fetcher``; the cluster's fetches
from the run's object store and keeps one copy per node, by content). A plain path is returned as it is.
"""

from __future__ import annotations

import re
from typing import Callable

PREFIX = "carried:sha256:"
_REF = re.compile(r"carried:sha256:([0-9a-f]{64})/([A-Za-z0-9._+-]{1,120})")

Fetcher = Callable[[str, str], str]
"""``fetch(digest, name) -> path``: a local file holding the content whose SHA-256 is ``digest``."""

_fetcher: Fetcher | None = None


def carried_ref(digest: str, name: str) -> str:
    """The reference to a file whose content has SHA-256 ``digest``; ``name`` is kept for messages and tools
    that look at the suffix (``.bundle``)."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name)[:120] or "file"
    return f"{PREFIX}{digest}/{safe}"


def parse_ref(value: object) -> tuple[str, str] | None:
    """``(digest, name)`` of a carried reference, or None for anything else (a plain path)."""
    if not isinstance(value, str):
        return None
    match = _REF.fullmatch(value)
    return (match.group(1), match.group(2)) if match else None


def set_fetcher(fetcher: Fetcher | None) -> None:
    """Install how this process turns a carried reference into a local file (None: uninstall)."""
    global _fetcher
    _fetcher = fetcher


def installed() -> Fetcher | None:
    return _fetcher


def local_path(value: str) -> str:
    """A file of this machine for ``value``: a plain path as it is; a carried reference fetched (blocking: call
    it on a thread from async code). A reference with no fetcher installed is a ``FileNotFoundError``."""
    parsed = parse_ref(value)
    if parsed is None:
        return value
    if _fetcher is None:
        raise FileNotFoundError(f"{value} is a file carried by a farm, and this process has no way to fetch it "
                                "(only the farm's workers do)")
    return _fetcher(*parsed)
