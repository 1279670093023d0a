"""A run directory on disk: config and manifest, results.jsonl, trajectories, summary; resume via ``plan``.

Layout of ``<run_dir>/``: ``config.json`` (compared on resume), ``manifest.json`` (versions, hashes, seeds,
dataset row hashes; earlier segments under "history"), ``results.jsonl`` (one line per finished attempt, the
last line for a (task_id, sample_index) counts: ``rollout.store.resume.latest_per_key``), ``trajectories/<task>/
<rollout>.a<attempt>.json`` (written before its line, rewritten while the rollout runs), ``summary.json``,
``previous-<time>/`` (what --new-run moved aside), ``.lock`` (the one writer's), ``results.bad.jsonl`` (lines
``repair`` moved out). A line is ``RolloutResult`` without its trajectory (``StoredResult``).

Durability: a line is one ``write()`` and a flush, so a SIGKILL loses at most the line being written (dropped
on the next ``load``); ``fsync=True`` also covers power loss. A damaged line elsewhere is skipped and reported
(its key runs again) and ``repair`` moves it aside. One writer: ``open`` takes the lock for the store's life;
a second gets ``RunDirLocked``. Resuming refuses changed config keys and changed dataset rows with results.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from rollout.records import RolloutResult, Task
from rollout.store.files import (
    DirLock,
    RunDirLocked,
    StoredResult,
    parse_results,
    partial_trajectory_writer,
    repair_results,
    safe_name,
    write_json,
)
from rollout.store.manifest import DatasetChanged, changed_rows, resumed_manifest
from rollout.store.result_keys import RunConfigChanged, diff_result_keys
from rollout.store.resume import Plan, latest_per_key, plan_resume
from rollout.store.trajectories import TrajectoryFiles

__all__ = ["DatasetChanged", "RunConfigChanged", "RunDirLocked", "RunStore", "StoredResult",
           "partial_trajectory_writer", "safe_name"]


class RunStore(TrajectoryFiles):
    """One run directory. Appends are serialised in-process (single writer per run dir)."""

    def __init__(self, run_dir: str | Path, fsync: bool = False, keep_results: bool = True):
        self.run_dir = Path(run_dir)
        self.fsync = fsync
        self.keep_results = keep_results
        """False: an appended line is not kept in ``results`` (a long run stays flat: ~5 KB a result otherwise);
        ``latest_results`` then reads results.jsonl."""
        self.config_path = self.run_dir / "config.json"
        self.manifest_path = self.run_dir / "manifest.json"
        self.results_path = self.run_dir / "results.jsonl"
        self.summary_path = self.run_dir / "summary.json"
        self.trajectories_dir = self.run_dir / "trajectories"
        self.lock_path = self.run_dir / ".lock"
        self.bad_path = self.run_dir / "results.bad.jsonl"
        self.results: list[StoredResult] = []
        """Every line so far (stored + appended; only stored with ``keep_results=False``), lean, in file order."""
        self.bad_lines: list[int] = []
        """1-based numbers of the results.jsonl lines the last ``load()`` skipped as damaged."""
        self._file: Any = None
        self._dir_lock = DirLock(self.lock_path)
        self._lock = threading.Lock()  # asyncio tasks never interleave a sync append; threads might

    def open(self, config: dict[str, Any], manifest: dict[str, Any], new_run: bool = False,
             upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> "RunStore":
        """Lock, then create or resume the run dir; refuse a result-affecting config change, or a changed
        dataset row that has results (``manifest["dataset"]["rows"]``: task id -> row hash), unless ``new_run``.
        ``upgrade``: the stored config as this version writes it (a key spelled otherwise by an older version), so
        that a spelling alone never counts as a change. On failure the lock is released and nothing was written."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.acquire()
        try:
            self._open(config, manifest, new_run, upgrade)
        except BaseException:
            self.release()
            raise
        return self

    def _open(self, config: dict[str, Any], manifest: dict[str, Any], new_run: bool,
              upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        if new_run:
            self._move_aside()
        elif self.config_path.exists():
            stored = json.loads(self.config_path.read_text())
            stored = upgrade(stored) if upgrade is not None else stored
            changed = diff_result_keys(stored, config)
            if changed:
                raise RunConfigChanged(changed, str(self.run_dir))
        self.load()  # repairs a torn tail; damaged lines are skipped (see bad_lines)
        previous = json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else None
        if previous is not None:
            changed = changed_rows(previous, manifest, {r.task_id for r in self.results})
            if changed:
                raise DatasetChanged(changed, str(self.run_dir))
            manifest = resumed_manifest(previous, manifest)
        write_json(self.config_path, config, self.fsync)
        write_json(self.manifest_path, manifest, self.fsync)

    def acquire(self) -> "RunStore":
        """Take the run directory's lock for this store's life (see ``DirLock``)."""
        self._dir_lock.acquire()
        return self

    def release(self) -> None:
        """Drop the lock (the results file stays open if it is)."""
        self._dir_lock.release()

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

    def append(self, result: RolloutResult, trajectory: bool = True) -> StoredResult:
        """Write one line for a finished attempt (its trajectory file first, unless ``trajectory=False``).

        Returns the lean record, also kept in ``self.results`` (with ``keep_results``).
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
            if self.keep_results:
                self.results.append(stored)
        return stored

    def load(self) -> list[StoredResult]:
        """Parse results.jsonl. A torn last line (a kill inside its write) is dropped and cut from the file;
        any other line that is not a result is skipped and its number put in ``bad_lines`` (its key runs
        again on resume; ``repair()`` moves such lines to results.bad.jsonl)."""
        with self._lock:
            parsed = parse_results(self.results_path)
            self.results, self.bad_lines = parsed.results, [number for number, _raw, _why in parsed.bad]
            parsed.cut_torn_tail(self.results_path)
            return list(self.results)

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
            done = repair_results(self.results_path, self.bad_path)
            self.results, self.bad_lines = parse_results(self.results_path).results, []
        return done

    def latest_results(self) -> list[StoredResult]:
        """One result per (task_id, sample_index): the last line written for it (read from results.jsonl when
        appended lines are not kept)."""
        if self.keep_results:
            return latest_per_key(self.results)  # type: ignore[return-value]
        with self._lock:
            if self._file is not None:
                self._file.flush()
            return latest_per_key(parse_results(self.results_path).results)  # type: ignore[return-value]

    def plan(self, tasks: Iterable[Task], samples_per_task: int, max_attempts: int, retry_infra: bool = False) -> Plan:
        """Sort every (task, sample) into done, failed for good, or to run next (see ``rollout.store.resume``)."""
        return plan_resume(self.results, tasks, samples_per_task, max_attempts, retry_infra)

    def write_summary(self, summary: dict[str, Any]) -> Path:
        write_json(self.summary_path, summary, self.fsync)
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
            finished_at=time.time(),
        )
