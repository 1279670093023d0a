"""A finished run ends: the race that left ``rollout run --local`` idle after ``N/N done`` with the run lock held.

On Python 3.11 ``asyncio.wait_for`` swallows a cancel that lands in the turn its inner call finished (CPython
gh-86296); the driver's progress ticker waited on the backend's ``live()`` that way, so when ``live()`` answered in
the turn the last rollout ended, the ticker outlived its cancel and the final wait never returned. The fault is
injected deterministically: every rollout holds its result until the backend's next ``live()`` answer after all of
them are held, and that answer comes back in the very turn they end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SAME_TURN = textwrap.dedent('''
    """``rollout`` with one injected fault: the backend's live() answers in the turn the last rollout ends."""
    import asyncio
    import sys

    from cluster.cli.main import main
    from cluster.backends.local import LocalBackend

    ROLLOUTS = int(sys.argv.pop(1))
    held = 0
    release = None
    real_execute = LocalBackend.execute


    async def execute(self, task, meta, observers):
        global held, release
        result = await real_execute(self, task, meta, observers)
        release = release or asyncio.Event()
        held += 1
        await release.wait()
        return result


    async def live(self):
        if held == ROLLOUTS and not release.is_set():
            release.set()  # the held rollouts end in the next turn ...
            await asyncio.sleep(0)  # ... and so does this answer
        return None


    LocalBackend.execute, LocalBackend.live = execute, live
    sys.exit(main())
''')


def write_run(tmp_path: Path, rollouts: int) -> Path:
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": "Say hello, then submit.",
                                        "data": {"check": "true"}}) + "\n" for i in range(rollouts)))
    config = {
        "run_id": "ends",
        "model": {"type": "scripted", "policy": "bash_echo"},
        "agent": {"type": "mini_swe", "max_steps": 10},
        "environment": {"type": "shell", "command_timeout": 30},
        "runtime": {"type": "local"},
        "verifier": {"type": "check_command"},
        "dataset": {"path": str(data)},
        "farm": {"backend": "local"},
        "run": {"samples": 1, "concurrency": rollouts, "max_attempts": 1, "progress_interval": 0.05},
    }
    path = tmp_path / "ends.yaml"
    path.write_text(json.dumps(config))
    (tmp_path / "same_turn.py").write_text(SAME_TURN)
    return path


def cli(home: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """The real command line (``python script.py`` or ``-m cluster``), bounded: a hang fails the test."""
    env = {**os.environ, "ROLLOUT_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"`{' '.join(args)}` hung for {timeout:g}s; its stderr ended with:\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_run_whose_live_view_answers_in_the_turn_the_last_rollout_ends_still_ends_and_frees_its_lock(tmp_path):
    config = write_run(tmp_path, rollouts=4)
    ran = cli(tmp_path, str(tmp_path / "same_turn.py"), "4", "run", "--local", str(config))
    assert ran.returncode == 0, ran.stderr
    assert "4/4 done" in ran.stderr
    summary = json.loads((tmp_path / "ends" / "summary.json").read_text())
    assert summary["rollouts"]["completed"] == 4
    assert "run directory:" in ran.stderr.split("4/4 done")[-1]  # the summary came after the last progress line

    repaired = cli(tmp_path, "-m", "cluster", "repair", "ends")  # the lock is free: not refused as in use
    assert repaired.returncode == 0, repaired.stderr
    assert "nothing to repair" in repaired.stdout
    status = cli(tmp_path, "-m", "cluster", "status", "ends")
    assert status.stdout.startswith("run ends: FINISHED"), status.stdout
