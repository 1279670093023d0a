"""SWE-bench report formats: categories by the harness's rules, predictions files, the log layout, the run summary."""

from __future__ import annotations

import json

import pytest

from envs.swe.reports.harness import (
    Grade,
    is_resolved,
    load_predictions,
    prediction,
    run_summary,
    status_by_category,
    write_instance_report,
    write_preds,
    write_run_report,
)
from rollout.errors import ConfigError

STATUSES = {"a": "PASSED", "b": "XFAIL", "c": "FAILED", "d": "ERROR", "e": "SKIPPED"}
CASES = {
    "mixed": {"FAIL_TO_PASS": ["a", "b", "c", "d", "e", "missing"], "PASS_TO_PASS": ["a"]},
    "all pass": {"FAIL_TO_PASS": ["a", "b"], "PASS_TO_PASS": ["a"]},
    "only skipped": {"FAIL_TO_PASS": ["e"], "PASS_TO_PASS": []},
    "p2p missing": {"FAIL_TO_PASS": ["a"], "PASS_TO_PASS": ["a", "missing"]},
    "partial": {"FAIL_TO_PASS": ["a", "c"], "PASS_TO_PASS": ["b"]},
    "nothing expected": {"FAIL_TO_PASS": [], "PASS_TO_PASS": []},
}


def completed_grade(resolved: bool = True) -> Grade:
    status = status_by_category(STATUSES, CASES["all pass" if resolved else "mixed"])
    return Grade(instance_id="org__repo-1", patch_exists=True, patch_successfully_applied=True, resolved=resolved,
                 reward=float(resolved), tests_status=status, test_output="PASSED t::a\n", apply_method="git apply -v")


def test_categories_follow_the_harness_rules():
    status = status_by_category(STATUSES, CASES["mixed"])
    assert status["FAIL_TO_PASS"] == {"success": ["a", "b"], "failure": ["c", "d", "missing"]}  # skipped: neither
    assert status["FAIL_TO_FAIL"] == status["PASS_TO_FAIL"] == {"success": [], "failure": []}
    assert not is_resolved(status)
    assert is_resolved(status_by_category(STATUSES, CASES["all pass"]))
    assert is_resolved(status_by_category(STATUSES, CASES["only skipped"]))  # the harness counts a skip as no failure
    assert not is_resolved(status_by_category(STATUSES, CASES["p2p missing"]))
    to_fail = {"FAIL_TO_PASS": [], "PASS_TO_PASS": [], "FAIL_TO_FAIL": ["c"], "PASS_TO_FAIL": ["a"]}
    extra = status_by_category(STATUSES, to_fail)
    assert extra["FAIL_TO_FAIL"] == {"success": [], "failure": ["c"]} and extra["PASS_TO_FAIL"]["success"] == ["a"]
    fail_only = status_by_category(STATUSES, CASES["mixed"], fail_only=True)
    assert fail_only["FAIL_TO_PASS"] == {"success": ["a", "b", "d", "e", "missing"], "failure": ["c"]}


@pytest.mark.parametrize("fail_only", [False, True])
def test_categories_agree_with_the_swebench_harness(fail_only):
    try:
        from swebench.harness.constants import EvalType, ResolvedStatus
        from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    except Exception as exc:  # noqa: BLE001 - the optional package
        pytest.skip(f"swebench is not importable: {exc}")
    eval_type = EvalType.FAIL_ONLY if fail_only else EvalType.PASS_AND_FAIL
    for name, expected in CASES.items():
        theirs = get_eval_tests_report(STATUSES, expected, eval_type=eval_type)
        ours = status_by_category(STATUSES, expected, fail_only=fail_only)
        assert ours == theirs, name
        assert is_resolved(ours) == (get_resolution_status(theirs) == ResolvedStatus.FULL.value), name


def test_instance_report_layout(tmp_path):
    grade = completed_grade()
    where = write_instance_report(tmp_path, "run-1", "org/model-x", "org__repo-1", grade, "diff --git a/x b/x\n")
    assert where == tmp_path / "logs" / "run_evaluation" / "run-1" / "org__model-x" / "org__repo-1"
    assert (where / "patch.diff").read_text() == "diff --git a/x b/x\n"
    assert (where / "test_output.txt").read_text() == "PASSED t::a\n"
    report = json.loads((where / "report.json").read_text())
    assert list(report) == ["org__repo-1"]
    fields = report["org__repo-1"]
    # The harness's fields, then the test command's exit code (readers of the harness's reports skip it).
    assert list(fields) == ["patch_is_None", "patch_exists", "patch_successfully_applied", "resolved", "tests_status",
                            "test_returncode"]
    assert fields["resolved"] is True and fields["patch_is_None"] is False
    assert list(fields["tests_status"]) == ["FAIL_TO_PASS", "PASS_TO_PASS", "FAIL_TO_FAIL", "PASS_TO_FAIL"]
    assert fields["tests_status"]["FAIL_TO_PASS"] == {"success": ["a", "b"], "failure": []}
    assert "resolved: True" in (where / "run_instance.log").read_text()
    # From the reward details (a dict) too, as results.jsonl holds them.
    again = write_instance_report(tmp_path / "b", "run-1", "m", "org__repo-1", grade.model_dump(), None)
    assert json.loads((again / "report.json").read_text()) == grade.report_json()
    assert (again / "patch.diff").read_text() == ""


def test_no_report_json_where_the_harness_writes_none(tmp_path):
    """The harness writes report.json only when the patch applied and the tests finished in time."""
    not_applied = Grade(instance_id="i", patch_exists=True, apply_output="error: patch failed")
    timed_out = Grade(instance_id="i", patch_exists=True, patch_successfully_applied=True, timed_out=True,
                      test_output="Timeout error")
    empty = Grade(instance_id="i", patch_is_None=True)
    for name, grade in {"not_applied": not_applied, "timed_out": timed_out, "empty": empty}.items():
        where = write_instance_report(tmp_path / name, "r", "m", "i", grade, "x")
        assert not (where / "report.json").exists()
        assert (where / "test_output.txt").exists() is (name == "timed_out")
    assert "did not apply" in (tmp_path / "not_applied/logs/run_evaluation/r/m/i/run_instance.log").read_text()


def test_predictions_round_trip_in_every_form(tmp_path):
    preds = {"a__b-1": prediction("a__b-1", "m", "diff"), "a__b-2": prediction("a__b-2", "m", None)}
    assert preds["a__b-1"] == {"instance_id": "a__b-1", "model_name_or_path": "m", "model_patch": "diff"}
    write_preds(tmp_path / "preds.json", preds)
    assert json.loads((tmp_path / "preds.json").read_text()) == preds
    assert load_predictions(tmp_path / "preds.json") == preds
    (tmp_path / "list.json").write_text(json.dumps(list(preds.values())))
    assert load_predictions(tmp_path / "list.json") == preds
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n\n" for p in preds.values()))
    assert load_predictions(tmp_path / "p.jsonl") == preds
    (tmp_path / "one.json").write_text(json.dumps(preds["a__b-1"]))
    assert load_predictions(tmp_path / "one.json") == {"a__b-1": preds["a__b-1"]}
    (tmp_path / "keyed.json").write_text(json.dumps({"a__b-3": {"model_patch": "d", "model_name_or_path": "m"}}))
    assert load_predictions(tmp_path / "keyed.json")["a__b-3"]["instance_id"] == "a__b-3"
    (tmp_path / "bad.jsonl").write_text('{"model_patch": "x"}\n')
    with pytest.raises(ConfigError, match="instance_id"):
        load_predictions(tmp_path / "bad.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"instance_id": \n')
    with pytest.raises(ConfigError, match="broken.jsonl"):
        load_predictions(tmp_path / "broken.jsonl")


def test_run_summary_sorts_every_instance_like_the_harness(tmp_path):
    ids = ["r", "u", "empty", "none", "nopred", "noapply", "ungraded", "timeout"]
    preds = {i: prediction(i, "org/m", "diff") for i in ids if i != "nopred"}
    preds["empty"]["model_patch"], preds["none"]["model_patch"] = "", None
    preds["extra"] = prediction("extra", "org/m", "diff")  # not in the dataset: submitted all the same
    grades = {
        "r": completed_grade(True), "u": completed_grade(False).model_dump(),
        "noapply": Grade(instance_id="noapply", patch_exists=True),
        "timeout": Grade(instance_id="timeout", patch_exists=True, patch_successfully_applied=True, timed_out=True),
    }
    summary = run_summary(ids, preds, grades)
    assert summary == {
        "total_instances": 8, "submitted_instances": 8, "completed_instances": 2, "resolved_instances": 1,
        "unresolved_instances": 1, "empty_patch_instances": 2, "error_instances": 3,
        "completed_ids": ["r", "u"], "incomplete_ids": ["nopred"], "empty_patch_ids": ["empty", "none"],
        "submitted_ids": sorted(preds), "resolved_ids": ["r"], "unresolved_ids": ["u"],
        "error_ids": ["noapply", "timeout", "ungraded"], "schema_version": 2,
    }
    path = write_run_report(tmp_path, "org/m", "run-1", summary)
    assert path.name == "org__m.run-1.json" and json.loads(path.read_text()) == summary


def test_report_json_says_why_a_patch_is_unresolved(tmp_path):
    grade = completed_grade(resolved=False).model_copy(update={
        "test_returncode": 137, "unresolved_reason": "the test command exited with 137", "restored": ["conftest.py"]})
    where = write_instance_report(tmp_path, "r", "m", "org__repo-1", grade, "x")
    fields = json.loads((where / "report.json").read_text())["org__repo-1"]
    assert fields["resolved"] is False and fields["test_returncode"] == 137
    assert fields["unresolved_reason"] == "the test command exited with 137"
    log = (where / "run_instance.log").read_text()
    assert "the test command exited with 137" in log and "restored to base_commit: conftest.py" in log
