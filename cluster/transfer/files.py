"""Files a task names, carried to the node that runs it (``rollout.data.carried``).

The driver's half (``FileCarrier``): before a task leaves for a worker, each of its path fields that names a file
of the driver's machine (a repo bundle, or a repository directory, sent as a bundle of all its refs) is read once,
put in the object store, filed with the depot under its SHA-256, and replaced in the task by a carried reference.
The node's half (``NodeFiles``): the worker fetches a reference's bytes once per node, checks their digest, and
keeps them under ``<cache>/files/<digest>/<name>``, where every later rollout of the node finds them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import ray

from envs.runtimes.prepared import bundle_bytes
from rollout.data.carried import carried_ref, parse_ref
from rollout.data.dataset import PATH_FIELDS
from rollout.records import Task


def node_cache() -> Path:
    """Where a node keeps what it fetched: ``ROLLOUT_FARM_CACHE``, else ``$XDG_CACHE_HOME/rollout-farm``, else
    ``~/.cache/rollout-farm``."""
    given = os.environ.get("ROLLOUT_FARM_CACHE")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-farm"


class FileCarrier:
    def __init__(self, depot: Any):
        self.depot = depot
        self._refs: dict[tuple[str, int, int], str] = {}
        self._objects: list[Any] = []  # the driver owns the bytes as long as it lives
        self._lock = asyncio.Lock()
        self.carried_bytes = 0

    async def carry(self, task: Task) -> Task:
        """``task`` with its path fields as carried references (a copy; the caller's task is unchanged)."""
        fields = {name: task.data[name] for name in PATH_FIELDS
                  if isinstance(task.data.get(name), str) and task.data[name]
                  and parse_ref(task.data[name]) is None and os.path.exists(task.data[name])}
        if not fields:
            return task
        data = dict(task.data)
        for name, path in fields.items():
            data[name] = await self._ref(path)
        return task.model_copy(update={"data": data})

    async def _ref(self, path: str) -> str:
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        async with self._lock:  # one read and one put per file, however many tasks name it
            if key not in self._refs:
                self._refs[key] = await asyncio.to_thread(self._put, path)
            return self._refs[key]

    def _put(self, path: str) -> str:
        data = bundle_bytes(path)
        digest = hashlib.sha256(data).hexdigest()
        name = Path(path).name + ("" if os.path.isfile(path) else ".bundle")
        ref = ray.put(data)
        self._objects.append(ref)
        ray.get(self.depot.add_file.remote(digest, [ref]))
        self.carried_bytes += len(data)
        return carried_ref(digest, name)


class NodeFiles:
    """``rollout.data.carried``'s fetcher on a node: ``(digest, name) -> path`` of a local copy."""

    def __init__(self, depot: Any, cache: Path | None = None, timeout: float = 600.0):
        self.depot, self.cache, self.timeout = depot, cache or node_cache(), timeout
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.fetched = 0

    def __call__(self, digest: str, name: str) -> str:
        target = self.cache / "files" / digest / name
        if target.is_file():
            return str(target)
        with self._guard:
            lock = self._locks.setdefault(digest, threading.Lock())
        with lock:
            if target.is_file():
                return str(target)
            boxed = ray.get(self.depot.file.remote(digest), timeout=self.timeout)
            if not boxed:
                raise FileNotFoundError(f"the driver has no file with digest {digest[:12]} ({name}) to send")
            data = ray.get(boxed[0], timeout=self.timeout)
            if hashlib.sha256(data).hexdigest() != digest:
                raise OSError(f"{name}: the bytes fetched do not match their digest {digest[:12]}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as partial:
                partial.write(data)
            os.replace(partial.name, target)  # whole or absent: a killed fetch leaves no half file
            self.fetched += len(data)
        return str(target)
