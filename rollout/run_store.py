"""A run directory on disk: config and manifest, results.jsonl, trajectories, summary; resume via ``plan``.

Layout of ``<run_dir>/``::

    config.json          the resolved config (compared on resume)
    manifest.json        versions, git SHA, hashes, seeds; earlier segments under "history"
    results.jsonl        one line per finished attempt, appended and flushed as each finishes
    trajectories/<task>/<rollout>.a<attempt>.json   the full record, rewritten as the rollout goes
    summary.json         written at the end
    previous-<time>/     what --new-run moved aside (nothing is ever deleted)
    .lock                held (flock) by the one process writing the run; holds its pid
    results.bad.jsonl    lines ``rollout repair`` moved out of results.jsonl (only if it found any)

results.jsonl stays lean: a line is the ``RolloutResult`` without its ``trajectory``, plus
``trajectory_path`` (relative to the run dir) and ``num_steps``; it loads back as a
``StoredResult``. The trajectory file holds the whole ``RolloutResult`` and is written before
its line, so a line never points to a missing file.

A key ``(task_id, sample_index)`` may have several lines (one per attempt); **the last line
for a key is the one that counts**. Readers dedupe with ``rollout.resume.latest_per_key`` (or, in jq,
``jq -s 'group_by([.task_id, .sample_index]) | map(last)'``).

Durability: each line is one ``write()`` followed by a flush, so a SIGKILL of the process
loses at most the line being written (its partial tail is dropped and repaired on the next
``load()``); ``fsync=True`` also protects against power loss, at a cost per line. A damaged line
elsewhere (a disk fault, a hand edit) is skipped and reported by ``load()`` (its key runs again) and
moved to results.bad.jsonl by ``repair()``: a damaged file never strands a run.

One writer: ``open()`` takes an exclusive lock on ``.lock`` for the life of the store (until
``release()`` or the process's end, however it ends); a second writer gets ``RunDirLocked`` naming
the holder's pid. A resumed run compares the dataset rows it selects with the rows the stored results
came from (``manifest.json`` ``dataset.rows``) and refuses changed ones (``DatasetChanged``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from rollout.errors import ConfigError
from rollout.manifest import diff_result_keys
from rollout.records import RequestMeta, RolloutResult, Task, Trajectory
from rollout.resume import Plan, latest_per_key, plan_resume


class RunConfigChanged(ConfigError):
    """The stored config differs from this one in keys that change results."""

    def __init__(self, keys: list[str], run_dir: str = ""):
        where = f" of {run_dir}" if run_dir else ""
        super().__init__(
            f"config{where} changed in result-affecting keys: {', '.join(keys)}; "
            "pass --new-run to start a new run (old files are kept under previous-*/)",
            "config",
        )
        self.keys, self.run_dir = list(keys), run_dir

    def __reduce__(self):  # rebuild from keys (``args`` keeps ConfigError's (message, field) for ``str``)
        return type(self), (self.keys, self.run_dir)


class RunDirLocked(ConfigError):
    """Another process is writing this run directory."""

    def __init__(self, run_dir: str, holder: str):
        super().__init__(f"{run_dir} is in use by another run (pid {holder}); wait for it to finish or stop it",
                         "run directory")
        self.run_dir, self.holder = run_dir, holder

    def __reduce__(self):
        return type(self), (self.run_dir, self.holder)


class DatasetChanged(ConfigError):
    """Dataset rows whose stored results came from a different version of the row."""

    def __init__(self, ids: list[str], run_dir: str = ""):
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        where = f" of {run_dir}" if run_dir else ""
        super().__init__(f"{len(ids)} dataset row(s) changed since their results{where} were written: {shown}; "
                         "pass --new-run to start a new run (old files are kept under previous-*/), or restore "
                         "the rows", "dataset")
        self.ids, self.run_dir = list(ids), run_dir

    def __reduce__(self):
        return type(self), (self.ids, self.run_dir)


class StoredResult(RolloutResult):
    """A results.jsonl line: the result without its trajectory (see ``RunStore.load_trajectory``)."""

    trajectory_path: str = ""
    """Relative to the run dir."""
    num_steps: int = 0


class RunStore:
    """One run directory. Appends are serialised in-process (single writer per run dir)."""

    def __init__(self, run_dir: str | Path, fsync: bool = False):
        self.run_dir = Path(run_dir)
        self.fsync = fsync
        self.config_path = self.run_dir / "config.json"
        self.manifest_path = self.run_dir / "manifest.json"
        self.results_path = self.run_dir / "results.jsonl"
        self.summary_path = self.run_dir / "summary.json"
        self.trajectories_dir = self.run_dir / "trajectories"
        self.lock_path = self.run_dir / ".lock"
        self.bad_path = self.run_dir / "results.bad.jsonl"
        self.results: list[StoredResult] = []
        """Every line so far (stored + appended), lean, in file order."""
        self.bad_lines: list[int] = []
        """1-based numbers of the results.jsonl lines the last ``load()`` skipped as damaged."""
        self._file: Any = None
        self._lock_file: Any = None
        self._lock = threading.Lock()  # asyncio tasks never interleave a sync append; threads might

    # ---- opening -------------------------------------------------------------------------------

    def open(self, config: dict[str, Any], manifest: dict[str, Any], new_run: bool = False) -> "RunStore":
        """Lock, then create or resume the run dir; refuse a result-affecting config change, or a changed
        dataset row that has results (``manifest["dataset"]["rows"]``: task id -> row hash), unless ``new_run``.
        On failure the lock is released and nothing was written."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.acquire()
        try:
            self._open(config, manifest, new_run)
        except BaseException:
            self.release()
            raise
        return self

    def _open(self, config: dict[str, Any], manifest: dict[str, Any], new_run: bool) -> None:
        if new_run:
            self._move_aside()
        elif self.config_path.exists():
            stored = json.loads(self.config_path.read_text())
            changed = diff_result_keys(stored, config)
            if changed:
                raise RunConfigChanged(changed, str(self.run_dir))
        self.load()  # repairs a torn tail; damaged lines are skipped (see bad_lines)
        previous = json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else None
        if previous is not None:
            rows = (manifest.get("dataset") or {}).get("rows")
            old_rows = (previous.get("dataset") or {}).get("rows") or {}
            if rows is not None:
                with_results = {r.task_id for r in self.results}
                changed = sorted(i for i, h in rows.items() if i in with_results and old_rows.get(i, h) != h)
                if changed:
                    raise DatasetChanged(changed, str(self.run_dir))
                # rows of tasks not selected this time keep the hash their results came from
                manifest = {**manifest, "dataset": {**manifest["dataset"], "rows": {**old_rows, **rows}}}
            # A resumed run keeps every segment's versions: results may come from different code.
            history = previous.pop("history", [])
            (previous.get("dataset") or {}).pop("rows", None)  # the top level has them all
            manifest = {**manifest, "history": [*history, previous]}
        _write_json(self.config_path, config, self.fsync)
        _write_json(self.manifest_path, manifest, self.fsync)

    # ---- the writer's lock ---------------------------------------------------------------------

    def acquire(self) -> "RunStore":
        """Take the run directory's exclusive lock (held until ``release()`` or this process ends, even by
        SIGKILL: the kernel drops it). Raises ``RunDirLocked`` naming the holder's pid if another has it."""
        if self._lock_file is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(self.lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunDirLocked(str(self.run_dir), holder) from None
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock_file = handle
        return self

    def release(self) -> None:
        """Drop the lock (the results file stays open if it is)."""
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

    def _move_aside(self) -> None:
        entries = [p for p in self.run_dir.iterdir() if not p.name.startswith("previous-") and p != self.lock_path]
        if not entries:
            return
        self.close_results()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.run_dir / f"previous-{stamp}", 1
        while target.exists():
            n += 1
            target = self.run_dir / f"previous-{stamp}-{n}"
        target.mkdir()
        for entry in entries:
            entry.rename(target / entry.name)
        self.results = []

    def close_results(self) -> None:
        """Close results.jsonl (the next ``append`` reopens it); the lock stays held."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def close(self) -> None:
        """Done writing: close results.jsonl and drop the lock."""
        self.close_results()
        self.release()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- results.jsonl -------------------------------------------------------------------------

    def append(self, result: RolloutResult, trajectory: bool = True) -> StoredResult:
        """Write one line for a finished attempt (its trajectory file first, unless ``trajectory=False``).

        Returns the lean record, also kept in ``self.results``.
        """
        if trajectory and not isinstance(result, StoredResult):
            self.write_trajectory(result)
        stored = self._lean(result)
        line = (stored.model_dump_json(exclude={"trajectory"}) + "\n").encode()
        with self._lock:
            if self._file is None:
                self._file = open(self.results_path, "ab")
            self._file.write(line)  # one write per line: a kill leaves at most one partial tail
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self.results.append(stored)
        return stored

    def load(self) -> list[StoredResult]:
        """Parse results.jsonl. A torn last line (a kill inside its write) is dropped and cut from the file;
        any other line that is not a result is skipped and its number put in ``bad_lines`` (its key runs
        again on resume; ``repair()`` moves such lines to results.bad.jsonl)."""
        with self._lock:
            self.results, bad, good_end, size = self._parse()
            self.bad_lines = [number for number, _raw, _why in bad]
            if good_end != size:
                with open(self.results_path, "r+b") as f:
                    f.truncate(good_end)
            return list(self.results)

    def _parse(self) -> tuple[list[StoredResult], list[tuple[int, bytes, str]], int, int]:
        """(results, damaged lines as (number, bytes, why), end of the last complete line, file size)."""
        try:
            data = self.results_path.read_bytes()
        except FileNotFoundError:
            return [], [], 0, 0
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        good_end = len(data) - len(tail)
        out: list[StoredResult] = []
        bad: list[tuple[int, bytes, str]] = []
        for number, raw in enumerate(lines, start=1):
            try:
                out.append(StoredResult.model_validate_json(raw))
            except ValidationError as exc:
                last = number == len(lines) and not tail
                if last and any(e["type"] == "json_invalid" for e in exc.errors()):
                    good_end -= len(raw) + 1  # the kill struck inside the last write: drop it
                    break
                bad.append((number, raw, exc.errors()[0]["msg"]))
        return out, bad, good_end, len(data)

    def describe_bad_lines(self) -> str | None:
        """One line for the user about the damaged lines the last ``load()`` skipped, or None."""
        if not self.bad_lines:
            return None
        shown = ", ".join(map(str, self.bad_lines[:10])) + (" ..." if len(self.bad_lines) > 10 else "")
        return (f"{self.results_path}: skipped {len(self.bad_lines)} damaged line(s) ({shown}); their rollouts run "
                f"again. `rollout repair {self.run_dir}` moves them to {self.bad_path.name}")

    def repair(self) -> dict[str, Any]:
        """Move every damaged line of results.jsonl (and a torn tail) to results.bad.jsonl, keeping the good
        lines in order; the rewrite is atomic. Needs the lock (refused while a run writes). Returns
        ``{"kept": n, "moved": [(line, why), ...]}``."""
        self.acquire()
        with self._lock:
            results, bad, good_end, size = self._parse()
            data = self.results_path.read_bytes() if size else b""
            moved = [(n, why) for n, _raw, why in bad]
            if good_end != size:
                bad.append((data[:good_end].count(b"\n") + 1, data[good_end:].rstrip(b"\n"), "torn last line"))
                moved.append((bad[-1][0], "torn last line"))
            if bad:
                with open(self.bad_path, "ab") as f:
                    for _n, raw, _why in bad:
                        f.write(raw + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                good = data[:good_end].split(b"\n")[:-1]
                bad_numbers = {n for n, _raw, _why in bad}
                keep = b"".join(raw + b"\n" for n, raw in enumerate(good, start=1) if n not in bad_numbers)
                _write_bytes(self.results_path, keep, fsync=True)
            self.results, self.bad_lines = results, []
        return {"kept": len(results), "moved": moved}

    def latest_results(self) -> list[StoredResult]:
        """One result per (task_id, sample_index): the last line written for it."""
        return latest_per_key(self.results)  # type: ignore[return-value]

    # ---- resume --------------------------------------------------------------------------------

    def plan(self, tasks: Iterable[Task], samples_per_task: int, max_attempts: int, retry_infra: bool = False) -> Plan:
        """Sort every (task, sample) into done, failed for good, or to run next (see ``rollout.resume``)."""
        return plan_resume(self.results, tasks, samples_per_task, max_attempts, retry_infra)

    # ---- trajectories and summary --------------------------------------------------------------

    def trajectory_path(self, rollout_id: str, attempt: int, task_id: str | None = None) -> Path:
        """``trajectories/<task id>/<rest of rollout id>.a<attempt>.json``, e.g. ``trajectories/t1/0.a1.json``.

        ``task_id`` defaults to the rollout id before its last '#' (rollout ids are ``<task>#<sample>``).
        Unsafe characters in ids are replaced (with a hash suffix, so distinct ids stay distinct).
        """
        task = task_id if task_id is not None else rollout_id.rsplit("#", 1)[0]
        rest = rollout_id[len(task) + 1 :] if rollout_id.startswith(task + "#") else rollout_id
        return self.trajectories_dir / safe_name(task) / f"{safe_name(rest)}.a{attempt}.json"

    def write_trajectory(self, result_or_meta: RolloutResult | RequestMeta, trajectory: Trajectory | None = None) -> Path:
        """Atomically (re)write a rollout's trajectory file.

        Give the finished ``RolloutResult`` (the whole record is written, ``"final": true``), or
        while the rollout runs, its ``RequestMeta`` and the ``Trajectory`` so far (``"final": false``).
        A final result with an empty trajectory (a worker that died) keeps the steps already on disk.
        """
        if isinstance(result_or_meta, RolloutResult):
            r = result_or_meta
            path = self.trajectory_path(r.rollout_id, r.attempt, r.task_id)
            doc = {"final": True, **RolloutResult.model_dump(r, mode="json")}
            if not (r.trajectory.steps or r.trajectory.messages) and path.exists():
                doc["trajectory"] = json.loads(path.read_text()).get("trajectory", doc["trajectory"])
        else:
            m = result_or_meta
            doc = {
                "final": False,
                "run_id": m.run_id,
                "rollout_id": m.rollout_id,
                "task_id": m.task_id,
                "sample_index": m.sample_index,
                "attempt": m.attempt,
                "status": "running",
                "trajectory": (trajectory or Trajectory()).model_dump(mode="json"),
            }
            path = self.trajectory_path(m.rollout_id, m.attempt, m.task_id)
        _write_json(path, doc, self.fsync, indent=None)  # rewritten every step: keep it compact
        return path

    def load_trajectory(self, result: RolloutResult) -> Trajectory | None:
        """The trajectory a results line points to, or None if its file is missing."""
        path = self.trajectory_path(result.rollout_id, result.attempt, result.task_id)
        try:
            return Trajectory.model_validate(json.loads(path.read_text())["trajectory"])
        except FileNotFoundError:
            return None

    def write_summary(self, summary: dict[str, Any]) -> Path:
        _write_json(self.summary_path, summary, self.fsync)
        return self.summary_path

    def _lean(self, result: RolloutResult) -> StoredResult:
        if isinstance(result, StoredResult):
            return result
        path = self.trajectory_path(result.rollout_id, result.attempt, result.task_id)
        fields = {name: getattr(result, name) for name in RolloutResult.model_fields if name != "trajectory"}
        return StoredResult(
            **fields,
            trajectory_path=str(path.relative_to(self.run_dir)),
            num_steps=len(result.trajectory.steps),
        )


PARTIAL_WRITE_INTERVAL = 2.0
"""Seconds between rewrites of a running rollout's trajectory file (plus one at the end)."""


def partial_trajectory_writer(store: RunStore, meta: RequestMeta, interval: float = PARTIAL_WRITE_INTERVAL):
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


def safe_name(text: str, limit: int = 120) -> str:
    """A file name for an id: unsafe characters become '_', plus a short hash whenever the id was altered."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:limit]
    if safe != text or safe in ("", ".", ".."):
        safe = f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return safe


def _write_bytes(path: Path, data: bytes, fsync: bool = False) -> None:
    """tmp + rename, as ``_write_json``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(path: Path, doc: Any, fsync: bool = False, indent: int | None = 1) -> None:
    """tmp + rename: a reader (or a killed writer) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=indent, default=str)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
