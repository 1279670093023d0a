"""`rollout gym collect` end to end, in subprocesses: the calculator resources server in this process, the scripted
model on the run's scripted server (its faults fail one row's model calls), the farm in the subprocess (backend local).
Output lines, the failures sidecar, resume after --limit and after an interrupt, bad input, a changed input;
which farm calls cover the missing pairs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.resources.calc_server import calc_rows, create_app
from envs.resources.serving import serve_in_thread

HERE = {"app": "scripted", "in_process": True}  # a scripted policy played on the farm's own event loop

REPO = Path(__file__).resolve().parents[2]
MODEL = {"type": "openai", "return_token_ids": True, "logprobs": True, "max_retries": 1, "backoff": 0.0}
FAILURE_KEYS = {"schema_version", "episode_id", "run_id", "source", "delivery", "failure", "http_status",
                "exception_type", "_ng_task_index", "_ng_rollout_index"}


@pytest.fixture(scope="module")
def calc():
    with serve_in_thread(create_app()) as server:
        yield server


@pytest.fixture
def files(tmp_path, calc):
    """(config writer, rows path, OUT path): 3 calculator rows; OUT in a directory not yet made."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in calc_rows(3, seed=3)))

    def config(faults: dict | None = None, latency: float = 0.0, concurrency: int = 8) -> Path:
        path = tmp_path / "run.yaml"
        path.write_text(json.dumps({
            "model": MODEL, "serve": {**HERE, "policy": "calculator", "faults": faults or {}, "latency": latency},
            "agent": {"type": "tool_calling", "max_steps": 6},
            "environment": {"type": "resources", "url": calc.url, "timeout": 10},
            "farm": {"backend": "local"}, "run": {"max_attempts": 2, "concurrency": concurrency}}))
        return path

    return config, rows, tmp_path / "results" / "rollouts.jsonl"


def collect(config: Path, rows: Path, out: Path, *args: str, popen: bool = False):
    argv = [sys.executable, "-m", "cluster", "gym", "collect", str(config), "--input", str(rows), "--output", str(out),
            "--num-repeats", "2", *args]
    if popen:  # SIGINT as a terminal's Ctrl-C sends it (a background parent may have it ignored)
        return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pairs(path: Path) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in records(path)]


def sidecar(out: Path) -> Path:
    return out.with_name(out.stem + "_failures.jsonl")


def test_rows_run_num_repeats_times_and_a_run_after_limit_writes_only_the_missing_rows(files):
    config, rows, out = files
    first = collect(config(), rows, out, "--limit", "2")
    assert first.returncode == 0, first.stderr
    assert sorted(pairs(out)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    inputs = calc_rows(3, seed=3)
    for line in records(out):
        assert line["reward"] == 1.0 and line["failure_reason"] is None and line["mask_sample"] is False
        assert line["expected_answer"] == inputs[line["_ng_task_index"]]["expected_answer"]
        kinds = [item["type"] for item in line["response"]["output"]]
        assert kinds == ["function_call", "function_call_output", "message"]
        assert line["response"]["output"][0]["generation_token_ids"]
    assert out.with_name("rollouts.collect.json").exists() and not sidecar(out).exists()
    assert "4/4" in first.stdout and "mean reward 1.0000" in first.stdout

    written = out.read_bytes()
    second = collect(config(), rows, out)
    assert second.returncode == 0, second.stderr
    assert "4 rollout(s) already in" in second.stderr and "running 2 rollout(s)" in second.stderr
    assert out.read_bytes().startswith(written)  # appended, never rewritten
    assert sorted(pairs(out)[4:]) == [(2, 0), (2, 1)]
    assert "6/6" in second.stdout and "(2 this run)" in second.stdout

    third = collect(config(), rows, out, "--progress", "0")
    assert third.returncode == 0 and "6 rollout(s) already in" in third.stderr
    assert len(records(out)) == 6 and "(0 this run)" in third.stdout


def test_a_row_whose_model_calls_always_fail_lands_in_the_sidecar_and_runs_again_on_resume(files, nemo_gym):
    config, rows, out = files
    failing = config(faults={"fail_first_n": 1000, "match": "t1#"})  # task 1's rollout ids: t1#0, t1#1
    first = collect(failing, rows, out)
    assert first.returncode == 3, first.stderr
    assert sorted(pairs(out)) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    failures = records(sidecar(out))
    assert sorted(pairs(sidecar(out))) == [(1, 0), (1, 1)]
    for record in failures:
        assert set(record) == FAILURE_KEYS and record["schema_version"] == 1
        assert record["source"] == "environment" and record["delivery"] == "delivered"
        assert record["http_status"] is None and record["exception_type"] == "ModelError"
        assert record["episode_id"]["attempt"] == 0 and record["run_id"]
        failure = record["failure"]
        assert failure["failure_kind"] == "agent_run_error" and failure["stage"] == "agent"
        assert failure["terminal"] is False and "500" in failure["failure_reason"]
    assert "agent_run_error x2" in first.stdout and str(sidecar(out)) in first.stdout
    ours = lambda record: {k: v for k, v in record.items() if not k.startswith("_ng_")}  # noqa: E731
    nemo_gym.validate_many([*(("nemo_gym.rollout_outcomes:RolloutFailure", ours(r)) for r in failures),
                            *(("nemo_gym.base_resources_server:BaseVerifyResponse", ours(r)) for r in records(out))])

    again = collect(failing, rows, out)  # still failing: one more attempt each, in the sidecar
    assert again.returncode == 3 and "2 rollout(s) failed before: running again" in again.stderr
    assert len(records(out)) == 4
    attempts = sorted((r["_ng_task_index"], r["_ng_rollout_index"], r["episode_id"]["attempt"])
                      for r in records(sidecar(out)))
    assert attempts == [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert {r["run_id"] for r in records(sidecar(out))} == {failures[0]["run_id"]}

    healed = collect(failing, rows, out, "serve.faults.fail_first_n=0")
    assert healed.returncode == 0, healed.stderr
    assert sorted(pairs(out)[4:]) == [(1, 0), (1, 1)] and len(records(sidecar(out))) == 4


def test_terminal_failures_are_never_retried(files):
    config, rows, out = files
    refused = config(faults={"fail_first_n": 1000, "match": "t1#", "status": 403})  # not retryable
    first = collect(refused, rows, out)
    assert first.returncode == 3
    assert [r["failure"]["terminal"] for r in records(sidecar(out))] == [True, True]
    again = collect(config(), rows, out)  # the model would answer now; terminal failures still do not run
    assert again.returncode == 3
    assert "2 rollout(s) failed for good (terminal): not retried" in again.stderr
    assert "running" not in again.stderr and len(records(out)) == 4 and len(records(sidecar(out))) == 2
    assert "(terminal) x2" in again.stdout


def test_an_interrupted_collection_resumes_with_only_the_missing_rows(files):
    config, rows, out = files
    slow = config(latency=0.5, concurrency=1)  # a rollout: two model calls, about a second
    process = collect(slow, rows, out, "--progress", "0.3", popen=True)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "run the same command to resume" in stderr and "/6 rollouts" in stderr  # progress lines
    done = pairs(out)
    assert 1 <= len(done) < 6
    with out.open("a") as handle:  # a line torn by a crash while writing it
        handle.write('{"_ng_task_index": 2, "_ng_rollo')

    resumed = collect(slow, rows, out, "serve.latency=0")
    assert resumed.returncode == 0, resumed.stderr
    assert "torn last line" in resumed.stderr and f"{len(done)} rollout(s) already in" in resumed.stderr
    assert pairs(out)[:len(done)] == done
    assert sorted(pairs(out)) == [(t, r) for t in range(3) for r in range(2)]


def test_a_malformed_input_line_fails_before_any_work_naming_the_line(files):
    config, rows, out = files
    good = rows.read_text().splitlines()
    rows.write_text("\n".join([good[0], '{"responses_create_params": {"input": "hi"', good[2]]) + "\n")
    bad_json = collect(config(), rows, out)
    assert bad_json.returncode == 2 and "line 2: not JSON" in bad_json.stderr
    rows.write_text("\n".join([good[0], good[1], json.dumps({"task_id": "x"})]) + "\n")
    not_a_row = collect(config(), rows, out)
    assert not_a_row.returncode == 2 and "line 3: row.responses_create_params" in not_a_row.stderr
    rows.write_text("\n".join(good) + "\n")
    bad_config = collect(config(), rows, out, "model.bogus=1")
    assert bad_config.returncode == 2 and "config error: model.bogus" in bad_config.stderr
    assert not out.parent.exists()  # nothing written: no OUT, no sidecar, no stamp


def test_a_changed_input_refuses_to_resume(files):
    config, rows, out = files
    assert collect(config(), rows, out, "--limit", "1").returncode == 0
    written = out.read_bytes()
    rows.write_text(rows.read_text().replace("Compute", "Work out", 1))
    refused = collect(config(), rows, out)
    assert refused.returncode == 2
    assert "different input file" in refused.stderr and "another --output" in refused.stderr
    assert out.read_bytes() == written


def test_the_gym_group_lists_collect():
    shown = subprocess.run([sys.executable, "-m", "cluster", "gym", "--help"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and "collect" in shown.stdout


def test_missing_pairs_run_as_whole_groups_where_they_can_and_one_seeded_repeat_otherwise():
    from cluster.cli.gym_collect import plan_calls

    # task 1 misses both repeats: one call of 2 samples; tasks 0 and 2 miss one each: a call of 1 sample per repeat
    assert plan_calls({0: [1], 1: [0, 1], 2: [0]}, 2) == [([1], 2, 0), ([2], 1, 0), ([0], 1, 1)]
    assert plan_calls({}, 3) == []
