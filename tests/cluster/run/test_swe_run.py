"""SWE runs end to end: the bundled mini benchmark through the agent loop, graded in fresh runtimes,
with the files SWE users read; `rollout eval` agrees with the run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "swe_demo.yaml"


def rollout(home, *args, timeout=600):
    env = {**os.environ, "ROLLOUT_HOME": str(home)}
    if args[:1] == ("run",):  # these tests are about runs, not the farm: in-process, no Ray start per test
        args = ("run", "--local", *args[1:])
    out = subprocess.run([sys.executable, "-m", "cluster", *args], env=env, capture_output=True, text=True,
                         timeout=timeout, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def results(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def swe_run(tmp_path, *overrides):
    """The SWE demo in process: its scripted model served by the in-process scripted server instead of Ray Serve
    (``test_serve_scripted`` runs the demo through Serve)."""
    data = tmp_path / "data" / "swe_mini.jsonl"
    return rollout(tmp_path, "run", str(CONFIG), f"dataset.path={data}", "dataset.slice=0:3", "serve=null",
                   "serve={app: scripted, in_process: true, policy: gold}", *overrides)


@pytest.mark.docker
def test_gold_resolves_every_instance_in_containers_and_eval_agrees(tmp_path, base_image):
    out = swe_run(tmp_path)
    assert "runtime: docker (a docker daemon answers)" in out.stderr
    run_dir = tmp_path / "swe_demo"
    rows = results(run_dir)
    assert len(rows) == 3
    assert all(r["reward"] == 1.0 and r["reward_details"]["resolved"] for r in rows)
    assert all(r["reward_details"]["patch_source"] == "submission" for r in rows)

    preds = json.loads((run_dir / "preds.json").read_text())
    assert set(preds) == {r["task_id"] for r in rows}
    for ident, pred in preds.items():  # the official predictions format
        assert set(pred) == {"instance_id", "model_name_or_path", "model_patch"}
        assert pred["instance_id"] == ident and pred["model_patch"].startswith("diff --git")
        report_dir = run_dir / "logs" / "run_evaluation" / "swe_demo" / pred["model_name_or_path"] / ident
        report = json.loads((report_dir / "report.json").read_text())[ident]
        assert report["resolved"] and report["patch_successfully_applied"]
        assert set(report["tests_status"]) == {"FAIL_TO_PASS", "PASS_TO_PASS", "FAIL_TO_FAIL", "PASS_TO_FAIL"}
        assert (report_dir / "test_output.txt").read_text() and (report_dir / "patch.diff").read_text()
    traj = json.loads(next((run_dir / "trajectories").rglob("*.traj.json")).read_text())
    assert traj["info"]["exit_status"] == "Submitted" and traj["info"]["submission"].startswith("diff --git")

    # the run's own preds.json graded again, without re-running: every instance resolved
    out = rollout(tmp_path, "eval", "--dataset", str(tmp_path / "data" / "swe_mini.jsonl"),
                  "--predictions", str(run_dir / "preds.json"), "--run-id", "regrade", "--runtime", "docker")
    report = next((tmp_path / "regrade").glob("*.regrade.json"))
    summary = json.loads(report.read_text())
    assert summary["resolved_instances"] == 3 and summary["unresolved_instances"] == 0


def test_empty_policy_resolves_nothing_on_the_local_runtime(tmp_path):
    swe_run(tmp_path, "serve.policy=empty", "run_id=swe_empty", "runtime={type: local}")
    rows = results(tmp_path / "swe_empty")
    assert len(rows) == 3
    assert all(r["status"] == "completed" and r["exit_reason"] == "submitted" for r in rows)
    assert all(r["reward"] == 0.0 and not r["reward_details"]["resolved"] for r in rows)
    summary = json.loads(next((tmp_path / "swe_empty").glob("*.swe_empty.json")).read_text())
    assert summary["empty_patch_instances"] == 3 and summary["resolved_instances"] == 0


def test_gold_on_the_local_runtime_resolves(tmp_path):
    out = swe_run(tmp_path, "run_id=swe_local", "runtime={type: local}", "dataset.slice=3:5")
    rows = results(tmp_path / "swe_local")
    assert len(rows) == 2 and all(r["reward"] == 1.0 for r in rows)
    # the trajectories name the model URL the run set when it started its scripted server, not the config's default
    url = re.search(r"the scripted policy 'gold' listens at (\S+)", out.stderr)[1]
    assert url != "http://127.0.0.1:8000/v1" and all(r["model_url"] == url for r in rows)
    for path in (tmp_path / "swe_local" / "trajectories").rglob("*.traj.json"):
        info = json.loads(path.read_text())["info"]
        assert info["config"]["model"]["base_url"] == url and info["written_by"].startswith("rollout-farm ")


@pytest.mark.docker
@pytest.mark.apptainer
def test_gold_resolves_all_twelve_on_apptainer_unprivileged_and_eval_agrees(tmp_path, base_image, apptainer_binary):
    """The whole demo with ``runtime.type=apptainer``: the instance images docker built, each converted once into a
    sandbox for the real binary, run and graded in instances as an unprivileged user."""
    data, cache = tmp_path / "data" / "swe_mini.jsonl", tmp_path / ".apptainer-cache"  # under ROLLOUT_HOME
    apptainer = ["runtime.type=apptainer"]
    out = rollout(tmp_path, "run", str(CONFIG), f"dataset.path={data}", "serve=null",
                  "serve={app: scripted, in_process: true, policy: gold}", "run_id=swe_apptainer", *apptainer,
                  timeout=1500)
    rows = results(tmp_path / "swe_apptainer")
    assert len(rows) == 12 and all(r["status"] == "completed" for r in rows), out.stderr[-3000:]
    unresolved = {r["task_id"]: r["reward_details"].get("unresolved_reason") for r in rows if r["reward"] != 1.0}
    assert unresolved == {}
    converted = sorted(os.listdir(cache))
    assert len(converted) == 12 and not [c for c in converted if ".partial" in c]  # one sandbox per instance image

    out = rollout(tmp_path, "eval", "--dataset", str(data), "--predictions", str(tmp_path / "swe_apptainer" /
                  "preds.json"), "--run-id", "regrade", "--runtime", "apptainer", timeout=900)
    summary = json.loads(next((tmp_path / "regrade").glob("*.regrade.json")).read_text())
    assert summary["resolved_instances"] == 12 and len(os.listdir(cache)) == 12  # graded on the same sandboxes
