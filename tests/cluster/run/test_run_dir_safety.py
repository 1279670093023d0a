"""A run directory you can trust, over the real CLI: one writer at a time, a changed dataset row refused on
resume, ids and paths from data kept inside the run directory, a damaged results line skipped and repaired,
and SWE rows whose fields would only fail at grading refused when the dataset loads."""

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "local_demo.yaml"
DEMO_DATA = REPO / "configs" / "data" / "local_demo.jsonl"


def rollout(home, *args, timeout=180):
    env = {**os.environ, "ROLLOUT_HOME": str(home)}
    if args[:1] == ("run",):
        args = ("run", "--local", *args[1:])
    return subprocess.run([sys.executable, "-m", "cluster", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def results(run_dir):
    path = run_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def demo_copy(tmp_path, rows=None):
    """The demo config over a copy of its dataset (rows: the dataset's rows, edited)."""
    rows = rows if rows is not None else [json.loads(line) for line in DEMO_DATA.read_text().splitlines()]
    data = tmp_path / "data" / "tasks.jsonl"
    data.parent.mkdir(exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "demo.yaml"
    config.write_text(DEMO.read_text().replace("data/local_demo.jsonl", str(data)))
    return config, data, rows


def test_a_second_run_on_the_same_directory_exits_2_naming_the_writer(tmp_path):
    env = {**os.environ, "ROLLOUT_HOME": str(tmp_path)}
    first = subprocess.Popen([sys.executable, "-m", "cluster", "run", "--local", str(DEMO), "serve.latency=0.3",
                              "run.concurrency=2"], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "local_demo"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not results(run_dir):
            time.sleep(0.05)
        assert results(run_dir), "the first run is under way"
        second = rollout(tmp_path, "run", str(DEMO), "serve.latency=0.3")
        assert second.returncode == 2, second.stderr
        assert f"in use by another run (pid {first.pid})" in second.stderr and second.stderr.count("\n") == 1
        assert first.wait(timeout=180) == 0, first.stderr.read()
    finally:
        first.kill()
    keys = Counter((r["task_id"], r["sample_index"]) for r in results(run_dir))
    assert len(keys) == 16 and set(keys.values()) == {1}, "every rollout ran once"
    again = rollout(tmp_path, "run", str(DEMO))  # the lock went with the first run
    assert again.returncode == 0 and "already done" in again.stderr, again.stderr


def test_a_changed_row_is_refused_on_resume_an_added_row_runs_alone(tmp_path):
    config, data, rows = demo_copy(tmp_path)
    assert rollout(tmp_path, "run", str(config), "dataset.slice=0:3").returncode == 0
    run_dir = tmp_path / "local_demo"
    assert len(results(run_dir)) == 6

    edited = [dict(r) for r in rows]
    edited[1]["prompt"] += " Then say done."
    data.write_text("".join(json.dumps(r) + "\n" for r in edited))
    refused = rollout(tmp_path, "run", str(config), "dataset.slice=0:3")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "1 dataset row(s) changed" in refused.stderr and rows[1]["task_id"] in refused.stderr
    assert rows[0]["task_id"] not in refused.stderr and len(results(run_dir)) == 6

    # the edited row left as it was, a row added: only the new one runs
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    more = rollout(tmp_path, "run", str(config), "dataset.slice=0:4")
    assert more.returncode == 0, more.stderr
    assert len(results(run_dir)) == 8 and {r["task_id"] for r in results(run_dir)[6:]} == {rows[3]["task_id"]}

    data.write_text("".join(json.dumps(r) + "\n" for r in edited))
    fresh = rollout(tmp_path, "run", str(config), "dataset.slice=0:4", "--new-run")
    assert fresh.returncode == 0, fresh.stderr
    assert len(results(run_dir)) == 8 and list(run_dir.glob("previous-*/results.jsonl"))


def test_unsafe_ids_and_outside_paths_stop_a_run_before_anything_is_written(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    config, data, rows = demo_copy(tmp_path)
    for row, field in [({**rows[0], "task_id": "../../victim"}, "field 'task_id'"),
                       ({**rows[0], "repo_path": "/etc"}, "field 'repo_path'")]:
        data.write_text("".join(json.dumps(r) + "\n" for r in [rows[1], row]))
        out = rollout(tmp_path, "run", str(config))
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert "line 2" in out.stderr and field in out.stderr, out.stderr
        assert not (tmp_path / "local_demo").exists()
    allowed = rollout(tmp_path, "run", str(config), "dataset.allow_outside_paths=true", "dataset.slice=0:1")
    assert allowed.returncode == 0, allowed.stderr
    assert (victim / "keep.txt").read_text() == "mine"


def test_a_damaged_line_is_skipped_on_resume_and_repair_moves_it_aside(tmp_path):
    assert rollout(tmp_path, "run", str(DEMO), "dataset.slice=0:2").returncode == 0
    run_dir = tmp_path / "local_demo"
    path = run_dir / "results.jsonl"
    good = path.read_text().splitlines(keepends=True)
    damaged_key = json.loads(good[1])["task_id"], json.loads(good[1])["sample_index"]
    path.write_text(good[0] + good[1][: len(good[1]) // 2] + "\x00garbage\n" + "".join(good[2:]))

    resumed = rollout(tmp_path, "run", str(DEMO), "dataset.slice=0:2")
    assert resumed.returncode == 0, resumed.stderr
    assert "skipped 1 damaged line(s) (2)" in resumed.stderr and "rollout repair" in resumed.stderr
    assert "1 to run" in resumed.stderr
    rerun = json.loads(path.read_text().splitlines()[-1])
    assert (rerun["task_id"], rerun["sample_index"]) == damaged_key

    repaired = rollout(tmp_path, "repair", str(run_dir))
    assert repaired.returncode == 0 and "line 2:" in repaired.stdout and "moved 1 line(s)" in repaired.stdout
    assert (run_dir / "results.bad.jsonl").read_text().count("\n") == 1
    assert all(json.loads(line) for line in path.read_text().splitlines())
    clean = rollout(tmp_path, "repair", "local_demo")  # a run id under ROLLOUT_HOME works too
    assert clean.returncode == 0 and "nothing to repair" in clean.stdout
    done = rollout(tmp_path, "run", str(DEMO), "dataset.slice=0:2")
    assert "already done" in done.stderr and "damaged line" not in done.stderr


def swe_dataset(tmp_path):
    """The bundled mini SWE benchmark, copied so rows can be edited; the first row."""
    from envs.swe.mini import build

    source = Path(build(tmp_path / "built"))
    target = tmp_path / "swe"
    shutil.copytree(source.parent, target)
    path = target / source.name
    return path, [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("field, value, says", [
    ("test_patch", "just some words, not a diff", "field test_patch: not a diff"),
    ("base_commit", "--output=/tmp/x", "field base_commit"),
    ("instance_id", "../../victim", "field 'instance_id'"),
])
def test_swe_rows_that_could_only_fail_at_grading_are_refused_when_the_dataset_loads(tmp_path, field, value, says):
    path, rows = swe_dataset(tmp_path)
    path.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], {**rows[1], field: value}]))
    config = tmp_path / "swe.yaml"
    text = (REPO / "configs" / "swe_demo.yaml").read_text()
    config.write_text(text.replace("../runs/datasets/swe_mini/swe_mini.jsonl", str(path))
                      .replace("  generate: envs.swe.mini:build   # writes the git bundles and the JSONL (cached)\n",
                               ""))
    out = rollout(tmp_path, "run", str(config))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "line 2" in out.stderr and says in out.stderr, out.stderr

    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": rows[0]["instance_id"], "model_name_or_path": "m",
                                 "model_patch": rows[0]["patch"]}) + "\n")
    graded = rollout(tmp_path, "eval", "--dataset", str(path), "--predictions", str(preds), "--runtime", "local")
    assert graded.returncode == 2 and "line 2" in graded.stderr and says in graded.stderr, graded.stderr
    assert not (tmp_path / "preds").exists()
