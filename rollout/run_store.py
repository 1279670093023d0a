"""A run directory on disk: config and manifest, results.jsonl, trajectories, summary; resume via ``plan``.

Layout of ``<run_dir>/``::

    config.json          the resolved config (compared on resume)
    manifest.json        versions, git SHA, hashes, seeds; earlier segments under "history"
    results.jsonl        one line per finished attempt, appended and flushed as each finishes
    trajectories/<task>/<rollout>.a<attempt>.json   the full record, rewritten as the rollout goes
    summary.json         written at the end
    previous-<time>/     what --new-run moved aside (nothing is ever deleted)

results.jsonl stays lean: a line is the ``RolloutResult`` without its ``trajectory``, plus
``trajectory_path`` (relative to the run dir) and ``num_steps``; it loads back as a
``StoredResult``. The trajectory file holds the whole ``RolloutResult`` and is written before
its line, so a line never points to a missing file.

A key ``(task_id, sample_index)`` may have several lines (one per attempt); **the last line
for a key is the one that counts**. Readers dedupe with ``rollout.resume.latest_per_key`` (or, in jq,
``jq -s 'group_by([.task_id, .sample_index]) | map(last)'``).

Durability: each line is one ``write()`` followed by a flush, so a SIGKILL of the process
loses at most the line being written (its partial tail is dropped and repaired on the next
``load()``); ``fsync=True`` also protects against power loss, at a cost per line.
"""

from __future__ import annotations

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
        self.results: list[StoredResult] = []
        """Every line so far (stored + appended), lean, in file order."""
        self._file: Any = None
        self._lock = threading.Lock()  # asyncio tasks never interleave a sync append; threads might

    # ---- opening -------------------------------------------------------------------------------

    def open(self, config: dict[str, Any], manifest: dict[str, Any], new_run: bool = False) -> "RunStore":
        """Create or resume the run dir; refuse a result-affecting config change unless ``new_run``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if new_run:
            self._move_aside()
        elif self.config_path.exists():
            stored = json.loads(self.config_path.read_text())
            changed = diff_result_keys(stored, config)
            if changed:
                raise RunConfigChanged(changed, str(self.run_dir))
        self.load()  # repairs a torn tail, and refuses a corrupt file before anything is written
        previous = json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else None
        if previous is not None:
            # A resumed run keeps every segment's versions: results may come from different code.
            history = previous.pop("history", [])
            manifest = {**manifest, "history": [*history, previous]}
        _write_json(self.config_path, config, self.fsync)
        _write_json(self.manifest_path, manifest, self.fsync)
        return self

    def _move_aside(self) -> None:
        entries = [p for p in self.run_dir.iterdir() if not p.name.startswith("previous-")]
        if not entries:
            return
        self.close()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.run_dir / f"previous-{stamp}", 1
        while target.exists():
            n += 1
            target = self.run_dir / f"previous-{stamp}-{n}"
        target.mkdir()
        for entry in entries:
            entry.rename(target / entry.name)
        self.results = []

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

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
        """Parse results.jsonl; a truncated last line is dropped and cut from the file."""
        with self._lock:
            self.results = self._read_and_repair()
            return list(self.results)

    def _read_and_repair(self) -> list[StoredResult]:
        try:
            data = self.results_path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        good_end = len(data) - len(tail)
        out: list[StoredResult] = []
        for number, raw in enumerate(lines, start=1):
            try:
                out.append(StoredResult.model_validate_json(raw))
            except ValidationError as exc:
                last = number == len(lines) and not tail
                if last and any(e["type"] == "json_invalid" for e in exc.errors()):
                    good_end -= len(raw) + 1  # the kill struck inside the last write: drop it
                    break
                raise ConfigError(f"line {number} is not a result: {exc.errors()[0]['msg']}", str(self.results_path)) from None
        if good_end != len(data):
            with open(self.results_path, "r+b") as f:
                f.truncate(good_end)
        return out

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
