"""The run directory: results.jsonl round trip and repair, resume planning, config checks, trajectories."""

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollout.errors import ConfigError, ExitReason
from rollout.records import ErrorInfo, RequestMeta, RolloutResult, Step, Task, Trajectory, Usage
from rollout.store.manifest import build_manifest
from rollout.store.result_keys import config_hash, diff_result_keys, result_affecting
from rollout.store.resume import attempt_record, latest_per_key
from rollout.store.run_dir import DatasetChanged, RunConfigChanged, RunDirLocked, RunStore

CONFIG = {
    "model": {"name": "scripted", "temperature": 0.0, "base_url": "http://127.0.0.1:8000/v1", "max_connections": 64},
    "agent": {"name": "swe", "step_limit": 30},
    "run": {"concurrency": 8, "samples_per_task": 2, "max_attempts": 3},
    "output": {"dir": "runs"},
}
TASKS = [Task(task_id="t1", prompt="a"), Task(task_id="t2", prompt="b")]


def result(task_id="t1", sample=0, attempt=1, infra=False, reward=1.0, steps=2):
    traj = Trajectory(
        messages=[{"role": "user", "content": "go"}]
        + [{"role": "assistant", "content": f"step {i}"} for i in range(steps)],
        steps=[Step(index=i + 1, message={"role": "assistant", "content": f"step {i}"}) for i in range(steps)],
    )
    common = dict(rollout_id=f"{task_id}#{sample}", task_id=task_id, sample_index=sample, attempt=attempt,
                  trajectory=traj)
    if infra:
        return RolloutResult(
            status="infra_failed",
            exit_reason=ExitReason.CONTAINER_START_FAILED,
            error=ErrorInfo(type="ContainerStartError", message="no image"),
            **common,
        )
    return RolloutResult(
        status="completed", exit_reason=ExitReason.SUBMITTED, reward=reward, usage=Usage(total_tokens=10), **common
    )


def opened(tmp_path, config=CONFIG, **kw):
    return RunStore(tmp_path / "run").open(config, {"config_hash": config_hash(config)}, **kw)


# ---- results.jsonl ---------------------------------------------------------------------------


def test_results_round_trip_without_trajectory_in_the_line(tmp_path):
    store = opened(tmp_path)
    original = result(steps=3)
    original.reward_details = {"FAIL_TO_PASS": {"success": ["t"]}}
    before = time.time()
    store.append(original)
    store.close()
    line = json.loads(store.results_path.read_text())
    assert "trajectory" not in line
    assert line["trajectory_path"] == "trajectories/t1/0.a1.json" and line["num_steps"] == 3
    assert before <= line["finished_at"] <= time.time()  # when it was written (the live page charts by it)

    assert (line["failure_cause"], line["reward_valid"]) == (None, True)  # derived, for readers of the file

    (back,) = RunStore(store.run_dir).load()
    fields = back.model_dump(exclude={"trajectory", "trajectory_path", "num_steps", "finished_at"})
    assert {k: v for k, v in fields.items() if k not in ("failure_cause", "reward_valid")} == (
        original.model_dump(exclude={"trajectory"}))
    assert back.num_steps == 3
    assert pickle.loads(pickle.dumps(back)) == back


def test_truncated_last_line_is_dropped_and_file_repaired(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1"))
    store.append(result("t2"))
    store.close()
    good = store.results_path.read_bytes()
    store.results_path.write_bytes(good + b'{"rollout_id": "t3#0", "task_id": "t')  # killed mid-write

    loaded = RunStore(store.run_dir).load()
    assert [r.task_id for r in loaded] == ["t1", "t2"]
    assert store.results_path.read_bytes() == good

    store2 = RunStore(store.run_dir)
    store2.load()
    store2.append(result("t3"))
    store2.close()
    assert [r.task_id for r in RunStore(store.run_dir).load()] == ["t1", "t2", "t3"]


def test_complete_but_invalid_last_line_is_dropped_too(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1"))
    store.close()
    good = store.results_path.read_bytes()
    store.results_path.write_bytes(good + b"\x00\x00\x00\n")  # what a power cut can leave
    assert [r.task_id for r in RunStore(store.run_dir).load()] == ["t1"]
    assert store.results_path.read_bytes() == good


def test_a_damaged_line_in_the_middle_is_skipped_and_reported_then_repair_moves_it_aside(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1"))
    store.append(result("t2"))
    store.close()
    first, second = store.results_path.read_bytes().splitlines(keepends=True)
    damaged = first + b'{"task_id": "t3", "rewa\x00\x00\n' + second
    store.results_path.write_bytes(damaged)
    resumed = RunStore(store.run_dir)
    assert [r.task_id for r in resumed.load()] == ["t1", "t2"] and resumed.bad_lines == [2]
    assert "skipped 1 damaged line(s) (2)" in resumed.describe_bad_lines()
    assert store.results_path.read_bytes() == damaged, "loading never rewrites a damaged file"
    with resumed:
        report = resumed.repair()
    assert report["kept"] == 2 and [line for line, _why in report["moved"]] == [2]
    assert store.results_path.read_bytes() == first + second
    assert store.bad_path.read_bytes() == b'{"task_id": "t3", "rewa\x00\x00\n'
    with RunStore(store.run_dir) as again:
        assert again.repair() == {"kept": 2, "moved": []}


def test_a_second_writer_is_refused_naming_the_holder_until_the_first_closes(tmp_path):
    first = opened(tmp_path)
    with pytest.raises(RunDirLocked, match=f"pid {os.getpid()}") as refused:
        opened(tmp_path)
    assert refused.value.field == "run directory"
    with pytest.raises(RunDirLocked):
        RunStore(first.run_dir).repair()
    first.close()
    opened(tmp_path).close()


def test_changed_rows_with_results_are_refused_new_and_unrun_rows_are_not(tmp_path):
    def manifest(rows):
        return {"dataset": {"path": "d.jsonl", "hash": "x", "rows": rows}}

    run_dir = tmp_path / "run"
    store = RunStore(run_dir).open(CONFIG, manifest({"t1": "h1", "t2": "h2"}))
    store.append(result("t1"))
    store.close()
    # t2 never ran: its row may change; t3 is new; t1 is not selected this time: kept as it was
    RunStore(run_dir).open(CONFIG, manifest({"t2": "h2b", "t3": "h3"})).close()
    rows = json.loads((run_dir / "manifest.json").read_text())["dataset"]["rows"]
    assert rows == {"t1": "h1", "t2": "h2b", "t3": "h3"}
    with pytest.raises(DatasetChanged, match="1 dataset row.*: t1; pass --new-run") as refused:
        RunStore(run_dir).open(CONFIG, manifest({"t1": "h1-edited", "t2": "h2b"}))
    assert refused.value.ids == ["t1"]
    RunStore(run_dir).open(CONFIG, manifest({"t1": "h1-edited"}), new_run=True).close()
    RunStore(run_dir).open(CONFIG, {}).close()  # a manifest without rows (an older run) resumes


def test_concurrent_appends_from_asyncio_tasks_give_whole_lines(tmp_path):
    store = opened(tmp_path)

    async def finish(i):
        await asyncio.sleep(0)
        store.append(result(f"t{i}", steps=i % 5))

    async def main():
        await asyncio.gather(*(finish(i) for i in range(200)))

    asyncio.run(main())
    store.close()
    assert sorted(r.task_id for r in RunStore(store.run_dir).load()) == sorted(f"t{i}" for i in range(200))


def test_sigkill_loses_nothing_that_was_appended(tmp_path):
    """A real process appends and is SIGKILLed; every line it reported written is on disk."""
    run_dir = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.rollout.test_run_store import result
        from rollout.store.run_dir import RunStore
        store = RunStore({str(run_dir)!r}).open({{}}, {{}})
        i = 0
        while True:
            store.append(result(f"t{{i}}"))
            print(i, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    reported = [proc.stdout.readline() for _ in range(50)]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    loaded = RunStore(run_dir).load()
    ids = [r.task_id for r in loaded]
    assert ids == [f"t{i}" for i in range(len(ids))]  # no gap, no duplicate
    assert len(ids) >= len(reported) == 50


def test_latest_line_per_key_counts(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1", attempt=1, infra=True))
    store.append(result("t2"))
    store.append(result("t1", attempt=2, reward=0.0))
    latest = store.latest_results()
    assert [(r.task_id, r.attempt, r.reward) for r in latest] == [("t1", 2, 0.0), ("t2", 1, 1.0)]
    assert latest_per_key(store.results) == latest


# ---- resume planning -------------------------------------------------------------------------


def keyed(plan):
    return {(t.task_id, s): a for t, s, a in plan.todo}


def test_plan_for_a_fresh_run_runs_everything_once(tmp_path):
    plan = opened(tmp_path).plan(TASKS, samples_per_task=2, max_attempts=3)
    assert keyed(plan) == {("t1", 0): 1, ("t1", 1): 1, ("t2", 0): 1, ("t2", 1): 1}
    assert plan.done_count == plan.final_failed_count == 0


def test_plan_skips_done_retries_infra_and_stops_when_exhausted(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1", 0))  # done
    store.append(result("t1", 1, attempt=1, infra=True))  # retry as attempt 2
    for attempt in (1, 2, 3):
        store.append(result("t2", 0, attempt=attempt, infra=True))  # exhausted
    store.close()

    resumed = RunStore(store.run_dir).open(CONFIG, {})
    plan = resumed.plan(TASKS, 2, max_attempts=3)
    resumed.close()
    assert keyed(plan) == {("t1", 1): 2, ("t2", 1): 1}
    assert plan.done_count == 1 and plan.final_failed_count == 1
    assert [a.attempt for a in plan.attempt_history("t2", 0)] == [1, 2, 3]
    assert plan.attempt_history("t2", 0)[0].exit_reason == ExitReason.CONTAINER_START_FAILED
    assert "1 done, 1 failed for good" in plan.describe()

    retry = RunStore(store.run_dir).open(CONFIG, {}).plan(TASKS, 2, max_attempts=3, retry_infra=True)
    assert keyed(retry)[("t2", 0)] == 4
    assert retry.attempt_limit("t2", 0) == 6 and retry.attempt_limit("t1", 1) == 3
    assert retry.final_failed_count == 0


def test_attempt_numbers_persist_across_two_resumes(tmp_path):
    run_dir = tmp_path / "run"
    for expected in (1, 2, 3):
        store = RunStore(run_dir).open(CONFIG, {})
        plan = store.plan(TASKS[:1], 1, max_attempts=3)
        (task, sample, attempt), = plan.todo
        assert attempt == expected
        failed = result(task.task_id, sample, attempt=attempt, infra=True)
        failed.attempts = plan.attempt_history(task.task_id, sample)
        store.append(failed)
        store.close()
    final = RunStore(run_dir).open(CONFIG, {})
    plan = final.plan(TASKS[:1], 1, max_attempts=3)
    assert plan.todo == [] and plan.final_failed_count == 1
    assert [a.attempt for a in final.results[-1].attempts] == [1, 2]
    assert [a.attempt for a in plan.attempt_history("t1", 0)] == [1, 2, 3]


def test_a_completed_retry_makes_the_key_done_and_carries_its_history(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1", 0, attempt=1, infra=True))
    (task, sample, attempt), = store.plan(TASKS[:1], 1, max_attempts=2).todo
    success = result(task.task_id, sample, attempt=attempt, reward=0.0)
    success.attempts = store.plan(TASKS[:1], 1, 2).attempt_history("t1", 0) + [attempt_record(success)]
    store.append(success)
    store.close()
    plan = RunStore(store.run_dir).open(CONFIG, {}).plan(TASKS[:1], 1, max_attempts=2)
    assert plan.todo == [] and plan.done_count == 1
    assert [(a.attempt, a.status) for a in plan.attempt_history("t1", 0)] == [(1, "infra_failed"), (2, "completed")]


# ---- config check, manifest, new run ---------------------------------------------------------


def test_result_affecting_change_is_refused_naming_the_keys(tmp_path):
    opened(tmp_path).close()
    changed = {**CONFIG, "agent": {"name": "swe", "step_limit": 50}, "model": {**CONFIG["model"], "temperature": 0.7}}
    with pytest.raises(RunConfigChanged) as info:
        opened(tmp_path, changed)
    assert info.value.keys == ["agent.step_limit", "model.temperature"]
    assert "agent.step_limit, model.temperature" in str(info.value) and "--new-run" in str(info.value)
    assert isinstance(info.value, ConfigError)
    back = pickle.loads(pickle.dumps(info.value))
    assert back.keys == info.value.keys and str(back) == str(info.value)


def test_non_result_keys_do_not_block_a_resume(tmp_path):
    opened(tmp_path).close()
    relaxed = {
        **CONFIG,
        "run": {"concurrency": 64, "samples_per_task": 4, "max_attempts": 5, "progress_interval": 1.0},
        "run_id": "renamed",
        "output": {"dir": "elsewhere"},
        "model": {**CONFIG["model"], "base_url": "http://10.0.0.1/v1", "max_connections": 4, "api_key": "x"},
        "farm": {"workers": 16},
    }
    store = opened(tmp_path, relaxed)
    assert json.loads(store.config_path.read_text())["run"]["concurrency"] == 64
    assert diff_result_keys(CONFIG, relaxed) == []
    assert config_hash(CONFIG) == config_hash(relaxed)


def test_diff_result_keys_reports_added_removed_and_changed_leaves():
    old = {"agent": {"step_limit": 30, "stop": ["a"]}, "seed": 1, "run": {"concurrency": 1}}
    new = {"agent": {"stop": ["a", "b"], "templates": {"system": "x"}}, "seed": 1}
    assert diff_result_keys(old, new) == ["agent.step_limit", "agent.stop", "agent.templates.system"]
    assert "run" not in result_affecting(old) or result_affecting(old)["run"] == {}
    assert diff_result_keys({"a": (1, 2)}, {"a": [1, 2]}) == []  # a JSON round trip changes nothing


def test_new_run_moves_old_files_aside(tmp_path):
    store = opened(tmp_path)
    store.append(result("t1"))
    store.write_trajectory(result("t1"))
    store.close()
    changed = {**CONFIG, "agent": {"name": "swe", "step_limit": 5}}
    fresh = opened(tmp_path, changed, new_run=True)
    assert fresh.results == [] and fresh.plan(TASKS, 1, 3).done_count == 0
    (aside,) = [p for p in fresh.run_dir.iterdir() if p.name.startswith("previous-")]
    assert (aside / "results.jsonl").read_text().count("\n") == 1
    assert json.loads((aside / "config.json").read_text())["agent"]["step_limit"] == 30
    assert (aside / "trajectories" / "t1" / "0.a1.json").exists()
    assert json.loads(fresh.config_path.read_text())["agent"]["step_limit"] == 5
    fresh.close()
    again = opened(tmp_path, changed, new_run=True)  # a second new run keeps both old sets
    assert len([p for p in again.run_dir.iterdir() if p.name.startswith("previous-")]) == 2


def test_manifest_records_versions_hashes_and_resume_history(tmp_path):
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text('{"task_id": "a"}\n')
    manifest = build_manifest(CONFIG, dataset, {"run": 7})
    assert manifest["version"] != "unknown" and manifest["python"].count(".") == 2
    assert "pydantic" in manifest["packages"]
    assert manifest["config_hash"] == config_hash(CONFIG) and len(manifest["dataset"]["hash"]) == 16
    assert manifest["seeds"] == {"run": 7}
    assert manifest["git_sha"] is None or len(manifest["git_sha"]) == 40
    json.dumps(manifest)
    run_dir = tmp_path / "run"
    RunStore(run_dir).open(CONFIG, manifest).close()
    RunStore(run_dir).open(CONFIG, {**manifest, "created": "later"}).close()
    stored = json.loads((run_dir / "manifest.json").read_text())
    assert stored["created"] == "later" and stored["history"][0]["created"] == manifest["created"]


# ---- trajectories and summary ----------------------------------------------------------------


def test_trajectory_written_as_it_goes_then_final(tmp_path):
    store = opened(tmp_path)
    meta = RequestMeta(rollout_id="django__django-1#0", task_id="django__django-1", sample_index=0, attempt=2)
    partial = result("django__django-1", steps=1).trajectory
    path = store.write_trajectory(meta, partial)
    assert path == store.run_dir / "trajectories" / "django__django-1" / "0.a2.json"
    doc = json.loads(path.read_text())
    assert doc["final"] is False and doc["status"] == "running" and len(doc["trajectory"]["steps"]) == 1

    done = result("django__django-1", attempt=2, steps=4)
    assert store.write_trajectory(done) == path
    doc = json.loads(path.read_text())
    assert doc["final"] is True and doc["reward"] == 1.0
    assert RolloutResult.model_validate({k: v for k, v in doc.items() if k != "final"}) == done
    stored = store.append(done)
    assert len(store.load_trajectory(stored).steps) == 4
    assert [p.name for p in path.parent.iterdir()] == ["0.a2.json"]  # no temp files left


def test_append_writes_the_trajectory_before_its_line(tmp_path):
    store = opened(tmp_path)
    stored = store.append(result("t1", steps=3))
    doc = json.loads((store.run_dir / stored.trajectory_path).read_text())
    assert doc["final"] is True and len(doc["trajectory"]["messages"]) == 4


def test_a_dead_worker_result_keeps_the_steps_already_on_disk(tmp_path):
    store = opened(tmp_path)
    meta = RequestMeta(rollout_id="t1#0", task_id="t1", attempt=1)
    store.write_trajectory(meta, result("t1", steps=2).trajectory)
    died = result("t1", infra=True)
    died.exit_reason, died.trajectory = ExitReason.WORKER_DIED, Trajectory()  # the driver knows nothing more
    stored = store.append(died)
    doc = json.loads((store.run_dir / stored.trajectory_path).read_text())
    assert doc["final"] is True and doc["exit_reason"] == "worker_died" and len(doc["trajectory"]["steps"]) == 2


def test_unsafe_ids_get_distinct_safe_paths(tmp_path):
    store = RunStore(tmp_path)
    a = store.trajectory_path("a/b#0", 1, "a/b")
    b = store.trajectory_path("a_b#0", 1, "a_b")
    assert a != b and a.parent.parent == b.parent.parent == tmp_path / "trajectories"
    assert store.trajectory_path("../x#0", 1).resolve().is_relative_to(tmp_path / "trajectories")


def test_write_summary_is_valid_json(tmp_path):
    store = opened(tmp_path)
    path = store.write_summary({"reward_mean": 0.5, "pass_at_k": {"1": 0.5}})
    assert json.loads(path.read_text())["pass_at_k"] == {"1": 0.5}
