"""The files of ``rollout gym collect``: the input rows (checked, hashed), OUT and its failures sidecar (what they
hold, appends flushed line by line), and the stamp that ties OUT to its input.

OUT: one verify reply a line + ``_ng_task_index``, ``_ng_rollout_index``. ``<stem>_failures.jsonl`` (NeMo Gym's
sidecar name): one line per failed attempt, NeMo Gym 0.7.0's ``RolloutFailure`` (``schema_version`` 1,
``episode_id``, ``run_id``, ``source``, ``delivery``, ``failure``, ``http_status``, ``exception_type``) + the same
two indices. ``<stem>.collect.json``: ``{input_sha256, run_id, input}``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from cluster.gym.rows import failure_of, verify_reply
from rollout.errors import ConfigError

TASK_INDEX, ROLLOUT_INDEX = "_ng_task_index", "_ng_rollout_index"
Pair = tuple[int, int]


class CollectError(ConfigError, ValueError):
    """Input, options or output files the command cannot run with (a ``ConfigError``: exit 2; nothing is written)."""


def sidecar_and_stamp(out: Path) -> tuple[Path, Path]:
    """OUT.jsonl -> (OUT_failures.jsonl, OUT.collect.json), next to it."""
    return out.with_name(out.stem + "_failures.jsonl"), out.with_name(out.stem + ".collect.json")


def read_rows(path: Path, limit: int | None) -> tuple[list[tuple[int, int, dict]], str]:
    """(line number, task index, row) of the rows of ``path`` (the first ``limit``), and the file's sha256."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CollectError(f"--input {path}: {exc.strerror or exc}") from None
    rows: list[tuple[int, int, dict]] = []
    lines: dict[int, int] = {}  # task index -> line number
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as exc:
            raise CollectError(f"{path} line {number}: not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise CollectError(f"{path} line {number}: not a JSON object")
        index = row.get(TASK_INDEX, len(rows))
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or index in lines:
            why = f"also line {lines[index]}'s" if index in lines else "not an integer >= 0"
            raise CollectError(f"{path} line {number}: {TASK_INDEX} {index!r} is {why}")
        lines[index] = number
        rows.append((number, index, row))
    if not rows:
        raise CollectError(f"--input {path}: no rows")
    return rows[:limit], hashlib.sha256(data).hexdigest()


def read_records(path: Path) -> list[dict]:
    """The lines of an output file this command wrote; a torn last line (a crash while writing it) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
        with path.open("r+b") as handle:
            handle.truncate(len(data))
        print(f"collect: cut a torn last line off {path} (a crash while writing it); it runs again", file=sys.stderr)
    records = []
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            record = json.loads(raw)
            record[TASK_INDEX], record[ROLLOUT_INDEX]
        except (ValueError, KeyError, TypeError):
            raise CollectError(f"{path} line {number}: not a line of this command (JSON with {TASK_INDEX} and "
                               f"{ROLLOUT_INDEX}); give another --output") from None
        records.append(record)
    return records


def check_stamp(out: Path, digest: str) -> tuple[dict, bool]:
    """(the stamp for this input, whether to write it); refuses an OUT written from another input."""
    sidecar, path = sidecar_and_stamp(out)
    try:
        stamp = json.loads(path.read_text())
    except (OSError, ValueError):
        stamp = {}
    if stamp.get("input_sha256") == digest:
        return stamp, False
    if any(p.exists() and p.stat().st_size for p in (out, sidecar)):
        why = (f"was written from a different input file (sha256 {str(stamp.get('input_sha256'))[:12]}..., this one "
               f"{digest[:12]}...)" if stamp else f"has no readable {path.name} (not written by this command)")
        raise CollectError(f"{out} {why}: refusing to resume; give another --output, or remove {out.name}, "
                           f"{sidecar.name} and {path.name} to start over")
    return {"input_sha256": digest, "run_id": f"collect-{uuid.uuid4().hex[:12]}"}, True


class Ledger:
    """OUT and its sidecar: the pairs written (their rewards), each pair's failed attempts; appends, flushed."""

    def __init__(self, out: Path, run_id: str):
        self.out, self.sidecar, self.run_id = out, sidecar_and_stamp(out)[0], run_id
        self.rewards: dict[Pair, Any] = {(r[TASK_INDEX], r[ROLLOUT_INDEX]): r.get("reward") for r in read_records(out)}
        self.failures: dict[Pair, list[dict]] = {}
        for record in read_records(self.sidecar):
            self.failures.setdefault((record[TASK_INDEX], record[ROLLOUT_INDEX]), []).append(record)
        self.written = self.failed_now = 0
        self._files: dict[Path, Any] = {}

    def terminal(self, pair: Pair) -> bool:
        return any((f.get("failure") or {}).get("terminal") for f in self.failures.get(pair, ()))

    def _append(self, path: Path, record: dict) -> None:
        """One line, flushed: a crash later loses nothing written (a crash during it: ``read_records`` cuts it)."""
        if path not in self._files:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._files[path] = path.open("a", encoding="utf-8")
        self._files[path].write(json.dumps(record) + "\n")
        self._files[path].flush()

    def add(self, pair: Pair, result: Any, row: dict) -> None:
        """A finished rollout: its verify reply to OUT, or (infrastructure failure) a failure record to the sidecar."""
        if result.status == "completed":
            self._append(self.out, {**verify_reply(result, row), TASK_INDEX: pair[0], ROLLOUT_INDEX: pair[1]})
            self.rewards[pair], self.written = result.reward, self.written + 1
            return
        attempts = self.failures.setdefault(pair, [])
        attempts.append({"schema_version": 1, "run_id": self.run_id, "source": "environment", "delivery": "delivered",
                         "episode_id": {"rollout_id": f"t{pair[0]}-r{pair[1]}", "attempt": len(attempts)},
                         "failure": failure_of(result), "http_status": None,
                         "exception_type": result.error.type if result.error else None,
                         TASK_INDEX: pair[0], ROLLOUT_INDEX: pair[1]})
        self._append(self.sidecar, attempts[-1])
        self.failed_now += 1

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
