"""The files of a run directory, written so that neither a reader nor a killed writer sees half of one:
results.jsonl lines (damaged ones found and moved aside), atomic JSON, safe file names, the writer's lock."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_serializer, model_validator

from rollout.errors import ConfigError
from rollout.records import RolloutResult
from rollout.records.result import DERIVED


class StoredResult(RolloutResult):
    """A results.jsonl line: the result without its trajectory (see ``RunStore.load_trajectory``)."""

    trajectory_path: str = ""
    """Relative to the run dir."""
    num_steps: int = 0
    finished_at: float | None = None
    """When the line was written (seconds since the epoch): a finished run's live page charts its results over time
    from it. None in lines written before it was recorded."""

    # Every line carries the keys derived from its exit reason (``DERIVED``: Harbor's failure cause, whether the
    # reward is valid), for readers of the file; they are dropped on reading.
    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(key in data for key in DERIVED):
            data = {k: v for k, v in data.items() if k not in DERIVED}
        return data

    @model_serializer(mode="wrap")
    def _with_derived(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        out["failure_cause"] = self.failure_cause
        out["reward_valid"] = self.reward_valid
        return out


@dataclass
class ParsedResults:
    results: list[StoredResult] = field(default_factory=list)
    bad: list[tuple[int, bytes, str]] = field(default_factory=list)
    """Damaged lines: (1-based number, bytes, why)."""
    good_end: int = 0
    """End of the last complete line: past it, a torn tail (a kill inside the last write)."""
    size: int = 0

    def cut_torn_tail(self, path: Path) -> None:
        if self.good_end != self.size:
            with open(path, "r+b") as f:
                f.truncate(self.good_end)


def parse_results(path: Path) -> ParsedResults:
    """Every line of a results.jsonl: results, damaged lines, and where a torn last line begins."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ParsedResults()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    parsed = ParsedResults(good_end=len(data) - len(tail), size=len(data))
    for number, raw in enumerate(lines, start=1):
        try:
            parsed.results.append(StoredResult.model_validate_json(raw))
        except ValidationError as exc:
            last = number == len(lines) and not tail
            if last and any(e["type"] == "json_invalid" for e in exc.errors()):
                parsed.good_end -= len(raw) + 1  # the kill struck inside the last write: drop it
                break
            parsed.bad.append((number, raw, exc.errors()[0]["msg"]))
    return parsed


def repair_results(path: Path, bad_path: Path) -> dict[str, Any]:
    """Move the damaged lines of ``path`` (and a torn tail) to ``bad_path``; the good lines stay, in order."""
    parsed = parse_results(path)
    data = path.read_bytes() if parsed.size else b""
    bad = list(parsed.bad)
    if parsed.good_end != parsed.size:
        bad.append((data[:parsed.good_end].count(b"\n") + 1, data[parsed.good_end:].rstrip(b"\n"), "torn last line"))
    if bad:
        with open(bad_path, "ab") as f:
            for _n, raw, _why in bad:
                f.write(raw + b"\n")
            f.flush()
            os.fsync(f.fileno())
        numbers = {n for n, _raw, _why in bad}
        good = data[:parsed.good_end].split(b"\n")[:-1]
        write_bytes(path, b"".join(raw + b"\n" for n, raw in enumerate(good, start=1) if n not in numbers), True)
    return {"kept": len(parsed.results), "moved": [(n, why) for n, _raw, why in bad]}


class RunDirLocked(ConfigError):
    """Another process is writing this run directory."""

    def __init__(self, run_dir: str, holder: str):
        super().__init__(f"{run_dir} is in use by another run (pid {holder}); wait for it to finish or stop it",
                         "run directory")
        self.run_dir, self.holder = run_dir, holder

    def __reduce__(self):
        return type(self), (self.run_dir, self.holder)


class DirLock:
    """An exclusive flock on ``path`` (its holder's pid inside), held until ``release()`` or the process ends,
    however it ends: the kernel drops it with the descriptor."""

    def __init__(self, path: Path):
        self.path = path
        self._handle: Any = None

    def acquire(self) -> None:
        """Raises ``RunDirLocked`` naming the holder's pid if another process has it."""
        if self._handle is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunDirLocked(str(self.path.parent), holder) from None
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def safe_name(text: str, limit: int = 120) -> str:
    """A file name for an id: unsafe characters become '_', plus a short hash whenever the id was altered."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:limit]
    if safe != text or safe in ("", ".", ".."):
        safe = f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return safe


def write_bytes(path: Path, data: bytes, fsync: bool = False) -> None:
    """tmp + rename: a reader (or a killed writer) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, doc: Any, fsync: bool = False, indent: int | None = 1) -> None:
    """``doc`` as JSON, atomically (see ``write_bytes``); parent directories made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, json.dumps(doc, ensure_ascii=False, indent=indent, default=str).encode("utf-8"), fsync)


PARTIAL_WRITE_INTERVAL = 2.0
"""Seconds between rewrites of a running rollout's trajectory file (plus one at the end)."""


def partial_trajectory_writer(store: Any, meta: Any, interval: float = PARTIAL_WRITE_INTERVAL) -> Any:
    """An observer that rewrites the rollout's trajectory file as steps finish, at most every ``interval``
    seconds: a killed run still shows how far each rollout got, without a write per step."""
    last = [0.0]

    def write_partial(event: Any) -> None:
        trajectory = event.data.get("trajectory")
        now = time.monotonic()
        if event.kind == "step_done" and trajectory is not None and now - last[0] >= interval:
            last[0] = now
            store.write_trajectory(meta, trajectory)

    return write_partial
