"""Where a node gets an image it lacks before building or pulling it by name: the sources its host installed.

A farm across machines installs two kinds in each worker: a registry (``envs.images.registry``: only the layers
the node lacks travel, so it is tried even before an instance image is built from its repository) and the run's
object store (``cluster.transfer``: a ``docker save`` from a machine that has the image, loaded here — the whole
image travels, so it is tried only for what this node cannot build cheaply). Every fetch is recorded
(``fetches``): which image, from where, how long, how many bytes, so a run can say what moved where.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from envs.images.daemon import watched


class ImageSource(Protocol):
    name: str
    layered: bool
    """Fetches only the layers this node lacks (a registry): cheaper than building an instance image here."""

    def fetch(self, image: str, client: Any) -> int | None:
        """Make ``image`` present in ``client``'s daemon: the bytes moved, or None when this source has not got
        it. Any other failure raises (an ``ImageError``, retryable when it may pass)."""


@dataclass
class Fetch:
    image: str
    source: str
    seconds: float
    bytes: int


_sources: list[ImageSource] = []
_fetches: list[Fetch] = []
_guard = threading.Lock()


def install(*sources: ImageSource) -> None:
    """The sources this process tries, in order (replacing any installed before)."""
    with _guard:
        _sources[:] = list(sources)


def installed() -> list[ImageSource]:
    with _guard:
        return list(_sources)


MAX_PARALLEL_FETCHES = 2
"""Images fetched at a time in one process (a node's worker): the others wait their turn, so a node that starts
many rollouts of new images at once does not saturate its link or its daemon."""


class Slots:
    """At most ``count`` holders at once, the semaphore made on first use (nothing happens at import)."""

    def __init__(self, count: int):
        self.count, self._semaphore, self._made = count, None, threading.Lock()

    def __enter__(self) -> None:
        with self._made:
            if self._semaphore is None:
                self._semaphore = threading.BoundedSemaphore(self.count)
        self._semaphore.acquire()

    def __exit__(self, *_: Any) -> None:
        self._semaphore.release()


_fetch_slots = Slots(MAX_PARALLEL_FETCHES)


def fetch_image(image: str, client: Any, *, layered_only: bool = False) -> str | None:
    """Try the installed sources in order; the name of the one that brought ``image``, or None."""
    for source in installed():
        if layered_only and not source.layered:
            continue
        with _fetch_slots:
            began = time.monotonic()
            moved = watched(client, lambda: source.fetch(image, client), f"the fetch of {image} from {source.name}")
        if moved is not None:
            with _guard:
                _fetches.append(Fetch(image, source.name, round(time.monotonic() - began, 3), int(moved)))
            return source.name
    return None


def fetches() -> list[Fetch]:
    """Every fetch this process made, oldest first."""
    with _guard:
        return list(_fetches)
