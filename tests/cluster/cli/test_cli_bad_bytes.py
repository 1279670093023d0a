"""Bytes that are not UTF-8, over the real command line: ``rollout status`` on a run whose results.jsonl has such a
line reports it (as resume and repair do) instead of a traceback, and ``rollout run`` on such a dataset names the
file and the line, not a byte offset into the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def rollout(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster", *args], env={**os.environ, "ROLLOUT_HOME": str(home)},
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def write_run(tmp_path: Path, dataset: bytes) -> Path:
    """A local run of scripted shell tasks (``bash_echo``: two commands, then submit) over ``dataset``."""
    data = tmp_path / "tasks.jsonl"
    data.write_bytes(dataset)
    config = {
        "run_id": "bytes",
        "model": {"type": "scripted", "policy": "bash_echo"},
        "agent": {"type": "mini_swe", "max_steps": 10},
        "environment": {"type": "shell", "command_timeout": 30},
        "runtime": {"type": "local"},
        "verifier": {"type": "check_command"},
        "dataset": {"path": str(data)},
        "farm": {"backend": "local"},
        "run": {"samples": 1, "max_attempts": 1},
    }
    path = tmp_path / "bytes.yaml"
    path.write_text(json.dumps(config))
    return path


def task_line(task_id: str) -> bytes:
    return json.dumps({"task_id": task_id, "prompt": "Say hello, then submit.", "data": {"check": "true"}}).encode()


def test_status_reports_a_results_line_that_is_not_utf8_instead_of_crashing(tmp_path):
    config = write_run(tmp_path, task_line("a") + b"\n" + task_line("b") + b"\n")
    ran = rollout(tmp_path, "run", "--local", str(config))
    assert ran.returncode == 0, ran.stderr
    results = tmp_path / "bytes" / "results.jsonl"
    first, second = results.read_bytes().splitlines()
    results.write_bytes(first + b"\n" + b'{"task_id": "caf\xe9", "status": "\xff"}\n' + second + b"\n")

    status = rollout(tmp_path, "status", "bytes")
    assert status.returncode == 0, status.stderr
    assert "Traceback" not in status.stderr
    assert status.stdout.startswith("run bytes: FINISHED"), status.stdout
    assert "rollouts        2  (completed 2, infra_failed 0)" in status.stdout
    assert "1 damaged line(s) skipped (2)" in status.stdout  # named as resume names it; repair moves it aside

    repaired = rollout(tmp_path, "repair", "bytes")
    assert repaired.returncode == 0, repaired.stderr
    assert "line 2:" in repaired.stdout
    assert "damaged" not in rollout(tmp_path, "status", "bytes").stdout

    (tmp_path / "bytes" / "live.json").write_bytes(b'{"run_id": "bytes", "state": "fin\xffished"}')
    unreadable = rollout(tmp_path, "status", str(tmp_path / "bytes"))
    assert unreadable.returncode == 0 and "Traceback" not in unreadable.stderr, unreadable.stderr
    assert unreadable.stdout.startswith("run bytes: no live view (unreadable)"), unreadable.stdout
    assert "rollouts        2  (completed 2, infra_failed 0)" in unreadable.stdout


def test_a_dataset_with_bytes_that_are_not_utf8_is_refused_naming_its_file_and_line(tmp_path):
    bad = json.dumps({"task_id": "c", "prompt": "PLACEHOLDER", "data": {"check": "true"}}).encode()
    config = write_run(tmp_path, b"\n".join([task_line("a"), task_line("b"), bad.replace(b"PLACEHOLDER", b"caf\xe9")])
                       + b"\n")
    ran = rollout(tmp_path, "run", "--local", str(config))
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr and "position" not in ran.stderr
    assert f"config error: {tmp_path / 'tasks.jsonl'}: line 3: not UTF-8 text: byte 0xe9 at column" in ran.stderr
    assert not (tmp_path / "bytes").exists()  # refused before the run directory is written
