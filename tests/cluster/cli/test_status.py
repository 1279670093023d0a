"""Seeing a run while it goes on: live.json kept by the driver, ``rollout status`` on a running run (its
in-flight rollouts, a hanging one flagged STALLED), on a finished run and on one whose driver was killed,
and the progress shown on a terminal (one redrawn line) versus in a log (plain lines)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import fields
from pathlib import Path

import pytest

from cluster.backends.live_tracker import LiveRollout as WorkerLiveRollout  # workers and the driver share one tracker
from cluster.run import job as jobs
from cluster.run.driver import Driver
from rollout.store import live

REPO = Path(__file__).resolve().parents[3]

POLICY = textwrap.dedent('''
    """Scripted policy for status tests: ``turns`` commands of ``sleep <pause>``, then submit."""
    from rollout.models.policies import SUBMIT_SENTINEL


    def steady(messages, ctx):
        data = ctx.task.data if ctx.task is not None else {}
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        if turn <= int(data.get("turns", 1)):
            return f"Turn {turn}.\\n```bash\\nsleep {data.get('pause', 0)} && echo turn {turn}\\n```"
        return f"Done.\\n```bash\\necho {SUBMIT_SENTINEL}\\n```"
''')


def task(task_id: str, pause: float, turns: int = 1) -> dict:
    return {"task_id": task_id, "prompt": "Sleep as told, then submit.",
            "data": {"pause": pause, "turns": turns, "check": "true"}}


def write_run(tmp_path: Path, tasks: list[dict], run_id: str = "watched", progress_interval: float = 1.0) -> Path:
    """A config (and its dataset and policy module) for a run of ``tasks`` with the local backend."""
    (tmp_path / "status_policies.py").write_text(POLICY)
    data = tmp_path / f"{run_id}.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = {
        "run_id": run_id,
        "model": {"type": "scripted", "policy": "status_policies:steady"},
        "agent": {"type": "mini_swe", "max_steps": 400},
        "environment": {"type": "shell", "command_timeout": 120},
        "runtime": {"type": "local"},
        "verifier": {"type": "check_command"},
        "dataset": {"path": str(data)},
        "farm": {"backend": "local"},
        "run": {"samples": 1, "concurrency": 8, "max_attempts": 1, "progress_interval": progress_interval},
        "output": {"dir": f"{run_id}-dir"},  # not the run id: ``rollout status <run id>`` finds it anyway
    }
    path = tmp_path / f"{run_id}.yaml"
    path.write_text(json.dumps(config))
    return path


def cli_env(home: Path) -> dict:
    return {**os.environ, "ROLLOUT_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(home), str(REPO)])}


def status(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster", "status", *args], env=cli_env(home), cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def row_of(output: str, task_id: str) -> str:
    (line,) = [line for line in output.splitlines() if line.strip().startswith(task_id + " ")]
    return line


def wait_for(what: str, condition, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def start_run(config: Path, home: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cluster", "run", "--local", str(config)], env=cli_env(home),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=(home / "run.stderr").open("w"),
                            start_new_session=True)


def exit_code_after_interrupt(proc: subprocess.Popen, home: Path, timeout: float = 60) -> int:
    """SIGINT, then the exit code; when the run does not stop in time, what it printed and what its processes
    were doing (the failure to look at)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        ps = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-g", str(proc.pid)], capture_output=True, text=True)
        pytest.fail(f"the run did not stop within {timeout:g}s of SIGINT; its processes:\n{ps.stdout}\n"
                    f"its stderr:\n{(home / 'run.stderr').read_text()[-3000:]}")


def live_when(run_dir: Path, condition):
    """Polls live.json until ``condition(doc, rows by task id)`` holds; returns the doc."""

    def check():
        try:
            doc = live.read_live(run_dir)
        except (FileNotFoundError, ValueError):
            return None
        return doc if condition(doc, {r["task_id"]: r for r in doc["in_flight"]}) else None

    return wait_for("the run to get there", check)


def test_status_of_a_running_run_lists_its_rollouts_and_flags_the_hanging_one(tmp_path):
    # quick-* finish at once; busy runs a short command every 0.2 s for a minute; hang's first command sleeps 300 s.
    config = write_run(tmp_path, [task("quick-a", 0), task("quick-b", 1), task("busy", 0.2, turns=300),
                                  task("hang", 300)])
    run_dir = tmp_path / "watched-dir"
    proc = start_run(config, tmp_path)
    try:
        doc = live_when(run_dir, lambda doc, rows: doc["done"] == 2 and "hang" in rows and "busy" in rows
                        and rows["busy"]["step"] >= 2 and doc["updated_at"] - rows["hang"]["last_progress"] >= 2.5)
        assert doc["run_id"] == "watched" and doc["state"] == "running" and doc["total"] == 4
        assert doc["outcomes"] == {"submitted": 2} and doc["infra_failed"] == 0
        row = next(r for r in doc["in_flight"] if r["task_id"] == "busy")
        assert {f.name for f in fields(WorkerLiveRollout)} | {"node_id", "worker"} <= set(row)  # a worker's shape
        assert row["last_command"].startswith("sleep 0.2 && echo turn")

        out = status(tmp_path, "watched", "--stall", "2")  # the run id, under $ROLLOUT_HOME
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert text.splitlines()[0].startswith("run watched: RUNNING")
        assert "2/4 done" in text and "in_flight=2" in text and "submitted=2" in text
        assert "in flight: 2; 1 STALLED" in text or "in flight: 2; 2 STALLED" in text
        assert row_of(text, "hang").endswith("STALLED")
        busy = row_of(text, "busy")
        assert "sleep 0.2 && echo turn" in busy and " local " in busy

        patient = status(tmp_path, str(run_dir), "--stall", "1000")  # a path works too; nothing is that idle
        assert patient.returncode == 0, patient.stderr
        assert "STALLED" not in patient.stdout
        assert "sleep 300" in row_of(patient.stdout, "hang")  # the hanging command shows while it runs
        assert row_of(patient.stdout, "busy")

        # Ctrl-C: the run stops its commands and says so in live.json
        assert exit_code_after_interrupt(proc, tmp_path) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    stopped = status(tmp_path, "watched")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines()[0].startswith("run watched: INTERRUPTED")
    assert "rollouts        2  (completed 2, infra_failed 0)" in stopped.stdout


def test_status_says_when_the_driver_is_gone(tmp_path):
    # Only short commands: a SIGKILLed driver leaves nothing running for long.
    config = write_run(tmp_path, [task("quick", 0), task("busy", 0.2, turns=300)], run_id="killed")
    proc = start_run(config, tmp_path)
    try:
        live_when(tmp_path / "killed-dir", lambda doc, rows: doc["done"] == 1 and "busy" in rows)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    dead = status(tmp_path, "killed")
    assert dead.returncode == 0, dead.stderr
    assert dead.stdout.splitlines()[0].startswith("run killed: STALE")
    assert "re-run the same command to resume" in dead.stdout
    assert "1 rollout(s) were in flight at the last update" in dead.stdout
    assert "rollouts        1  (completed 1, infra_failed 0)" in dead.stdout
    assert "in flight:" not in dead.stdout


def test_status_of_a_finished_run_shows_its_results_and_watch_returns(tmp_path):
    config = write_run(tmp_path, [task("quick-a", 0), task("quick-b", 0.5, turns=2)], run_id="done")
    ran = subprocess.run([sys.executable, "-m", "cluster", "run", "--local", str(config)], env=cli_env(tmp_path),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    doc = live.read_live(tmp_path / "done-dir")
    assert doc["state"] == "finished" and doc["done"] == doc["total"] == 2 and doc["in_flight"] == []

    out = status(tmp_path, "done", "--watch")  # the run is over: watching ends at once
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("run done: FINISHED")
    assert "2/2 done" in out.stdout and "submitted=2" in out.stdout
    assert "rollouts        2  (completed 2, infra_failed 0)" in out.stdout
    assert "in flight:" not in out.stdout

    missing = status(tmp_path, "no-such-run")
    assert missing.returncode == 2 and "no-such-run" in missing.stderr


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def in_process(tmp_path: Path, monkeypatch) -> None:
    """Runs in this process see the test's policy module and keep their run dirs under tmp_path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path))


def run_job(tmp_path: Path, out: io.StringIO, run_id: str) -> dict:
    config = write_run(tmp_path, [task("a", 0), task("b", 1.5), task("c", 0.2, turns=3)], run_id=run_id,
                       progress_interval=0.2)
    return asyncio.run(jobs.execute(jobs.prepare([str(config)], out=out)))


def test_progress_on_a_terminal_is_one_redrawn_line(tmp_path, monkeypatch, capsys):
    in_process(tmp_path, monkeypatch)
    out = Terminal()
    summary = run_job(tmp_path, out, "tty")
    assert summary["rollouts"]["completed"] == 3
    text = out.getvalue()
    progress = text[text.index("\r"):]
    drawn = progress.split("\r")[1:]
    assert len(drawn) >= 2  # redrawn while the 1.5 s command ran, and once more at the end
    assert all(" done  " in d and d.endswith("\x1b[K") for d in drawn[:-1])  # no newline between redraws
    assert drawn[-1].startswith("3/3 done") and "in_flight=0" in drawn[-1] and "submitted=3" in drawn[-1]
    assert drawn[-1].split("\x1b[K")[1].startswith("\nrun directory:")  # the line is left, the rest below it


def test_progress_in_a_log_is_plain_periodic_lines(tmp_path, monkeypatch, capsys):
    in_process(tmp_path, monkeypatch)
    out = io.StringIO()
    run_job(tmp_path, out, "log")
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = [line for line in text.splitlines() if line.startswith("[log] ")]
    assert lines, text  # the run lasts more than a progress interval
    assert all(" done  " in line and "in_flight=" in line and "infra=0" in line for line in lines)


def test_driver_live_state_has_worker_shaped_rows_and_the_file_says_interrupted(tmp_path, monkeypatch):
    in_process(tmp_path, monkeypatch)
    config = write_run(tmp_path, [task("quick", 0), task("slow", 300)], run_id="inproc")
    job = jobs.prepare([str(config)], out=io.StringIO())

    async def scenario():
        from cluster.assembly import FarmAssembly

        assembly = FarmAssembly.for_run(job.config, out=io.StringIO())
        backend = await jobs.open_farm(job, assembly)
        close = assembly.close
        driver = Driver(backend, job.store, job.plan, run_id=job.run_id, concurrency=4, progress_interval=0.2,
                        out=io.StringIO())
        running = asyncio.create_task(driver.run())
        try:
            while True:
                state = await driver.live_state()
                if state["done"] == 1 and state["in_flight"]:
                    break
                await asyncio.sleep(0.05)
            on_disk = live.read_live(job.run_dir)
        finally:
            running.cancel()  # as Ctrl-C does: the slow command is stopped
            await asyncio.gather(running, return_exceptions=True)
            await close()
            job.store.close()
        return state, on_disk

    state, on_disk = asyncio.run(asyncio.wait_for(scenario(), 120))
    (row,) = state["in_flight"]
    worker_keys = {f.name for f in fields(WorkerLiveRollout)} | {"node_id", "worker"}
    assert set(row) == worker_keys | {"elapsed", "idle"}
    assert (row["task_id"], row["sample_index"], row["attempt"], row["step"]) == ("slow", 0, 1, 0)
    assert on_disk["run_id"] == "inproc" and on_disk["total"] == 2
    after = live.read_live(job.run_dir)
    assert after["state"] == "interrupted" and after["in_flight"] == []
    assert live.live_condition(after)[0] == "interrupted"
