"""SWE-bench report formats: tests by category, predictions, per-instance reports, run summary (the Grade record:
``envs.swe.reports.grade_record``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from envs.swe.logs.pytest_log import FAILED, FAILING, PASSING
from envs.swe.reports.grade_record import Grade
from rollout.data.paths import under
from rollout.errors import ConfigError
from rollout.store.files import write_bytes

__all__ = ["Grade", "status_by_category", "is_resolved", "prediction", "write_preds", "load_predictions",
           "instance_log_dir", "write_instance_report", "run_summary", "write_run_report"]

KEY_INSTANCE_ID, KEY_MODEL, KEY_PREDICTION = "instance_id", "model_name_or_path", "model_patch"
FAIL_TO_PASS, PASS_TO_PASS, FAIL_TO_FAIL, PASS_TO_FAIL = "FAIL_TO_PASS", "PASS_TO_PASS", "FAIL_TO_FAIL", "PASS_TO_FAIL"
CATEGORIES = (FAIL_TO_PASS, PASS_TO_PASS, FAIL_TO_FAIL, PASS_TO_FAIL)
RUN_EVALUATION_DIR = Path("logs", "run_evaluation")


def status_by_category(statuses: Mapping[str, str], expected: Mapping[str, Iterable[str]],
                 fail_only: bool = False) -> dict[str, dict[str, list[str]]]:
    """Each expected test (by category) as success or failure, by the harness's rules: PASSED / XFAIL
    succeed; FAILED / ERROR or a test missing from the log fail; anything else (SKIPPED) is neither.
    ``fail_only`` (the harness's rule for some non-Python repos): only FAILED fails."""
    out: dict[str, dict[str, list[str]]] = {}
    for category in CATEGORIES:
        success: list[str] = []
        failure: list[str] = []
        for test in expected.get(category) or ():
            status = statuses.get(test)
            if fail_only:
                (failure if status == FAILED else success).append(test)
            elif status in PASSING:
                success.append(test)
            elif status is None or status in FAILING:
                failure.append(test)
        out[category] = {"success": success, "failure": failure}
    return out


def is_resolved(status: Mapping[str, Mapping[str, list[str]]]) -> bool:
    """Full resolution: no FAIL_TO_PASS and no PASS_TO_PASS failure."""
    return not status[FAIL_TO_PASS]["failure"] and not status[PASS_TO_PASS]["failure"]


# ---- predictions ------------------------------------------------------------------------------


def prediction(instance_id: str, model_name: str, patch: str | None) -> dict[str, Any]:
    return {KEY_INSTANCE_ID: instance_id, KEY_MODEL: model_name, KEY_PREDICTION: patch}


def write_preds(path: str | Path, preds: Mapping[str, Mapping[str, Any]]) -> None:
    """The harness's predictions file: a JSON object keyed by instance id, replaced atomically."""
    _write_atomic(Path(path), json.dumps(dict(preds), indent=2) + "\n")


def load_predictions(path: str | Path) -> dict[str, dict[str, Any]]:
    """Predictions by instance id from a JSON object (keyed by id), a JSON list, or JSONL."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read predictions: {getattr(exc, 'strerror', None) or exc}", str(path)) from None
    try:
        data = json.loads(text) if text.lstrip()[:1] in ("[", "{") and path.suffix != ".jsonl" else None
    except json.JSONDecodeError:
        data = None  # several objects, one per line
    if data is None:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON or JSONL: {exc.msg} (line {exc.lineno})", str(path)) from None
    if isinstance(data, dict):
        keyed = bool(data) and all(isinstance(v, dict) for v in data.values())
        data = [{KEY_INSTANCE_ID: k, **v} for k, v in data.items()] if keyed else [data]
    preds: dict[str, dict[str, Any]] = {}
    for number, pred in enumerate(data, start=1):
        if not isinstance(pred, dict) or not isinstance(pred.get(KEY_INSTANCE_ID), str):
            raise ConfigError(f"prediction {number} has no {KEY_INSTANCE_ID}", str(path))
        preds[pred[KEY_INSTANCE_ID]] = pred
    return preds


# ---- the harness's log layout ------------------------------------------------------------------


def instance_log_dir(root: str | Path, run_id: str, model: str, instance_id: str) -> Path:
    """``<root>/logs/run_evaluation/<run_id>/<model with / as __>/<instance_id>``, checked to stay inside
    ``<root>/logs/run_evaluation`` (ids come from data: a ``PathOutsideRoot`` rather than a write elsewhere)."""
    top = Path(root) / RUN_EVALUATION_DIR
    where = top / run_id / model.replace("/", "__") / instance_id
    under(top, where)
    return where


def write_instance_report(root: str | Path, run_id: str, model: str, instance_id: str,
                          grade: Grade | Mapping[str, Any], patch: str | None) -> Path:
    """Write the harness's files for one instance and return its directory: ``patch.diff`` always,
    ``test_output.txt`` once the patch applied, ``report.json`` only when the harness would write one
    (a patch applied and the tests finished), and ``run_instance.log`` saying what happened."""
    if not isinstance(grade, Grade):
        grade = Grade.model_validate(grade)
    where = instance_log_dir(root, run_id, model, instance_id)
    where.mkdir(parents=True, exist_ok=True)
    (where / "patch.diff").write_text(patch or "", encoding="utf-8")
    if grade.patch_successfully_applied:
        (where / "test_output.txt").write_text(grade.test_output, encoding="utf-8")
    if grade.completed:
        _write_atomic(where / "report.json", json.dumps(grade.report_json(), indent=4))
    (where / "run_instance.log").write_text(_instance_log(grade), encoding="utf-8")
    return where


def _instance_log(grade: Grade) -> str:
    if grade.patch_is_None or not grade.patch_exists:
        outcome = "no patch: not evaluated"
    elif not grade.patch_successfully_applied:
        outcome = "the patch did not apply"
    elif grade.timed_out:
        outcome = "the tests timed out"
    else:
        outcome = f"resolved: {grade.resolved}"
    if grade.unresolved_reason:
        outcome += f" ({grade.unresolved_reason})"
    lines = [f"instance: {grade.instance_id}", f"outcome: {outcome}", f"apply method: {grade.apply_method}",
             f"test command: {grade.test_cmd}", f"test return code: {grade.test_returncode}",
             f"restored to base_commit: {', '.join(grade.restored) or 'nothing'}",
             "durations: " + ", ".join(f"{k} {v:.2f}s" for k, v in grade.durations.items()), "", grade.apply_output]
    return "\n".join(lines) + "\n"


def run_summary(instance_ids: Iterable[str], predictions: Mapping[str, Mapping[str, Any]],
                grades: Mapping[str, Grade | Mapping[str, Any]]) -> dict[str, Any]:
    """The harness's run report: every dataset instance is incomplete (no prediction), an empty patch,
    completed (resolved or unresolved), or an error (no report: the patch did not apply, the tests timed
    out, or grading failed)."""
    ids = list(dict.fromkeys(instance_ids))
    sets: dict[str, set[str]] = {k: set() for k in ("completed", "incomplete", "empty_patch", "resolved",
                                                   "unresolved", "error")}
    for ident in ids:
        if ident not in predictions:
            sets["incomplete"].add(ident)
            continue
        if predictions[ident].get(KEY_PREDICTION) in ("", None):
            sets["empty_patch"].add(ident)
            continue
        grade = grades.get(ident)
        if grade is not None and not isinstance(grade, Grade):
            grade = Grade.model_validate(grade)
        if grade is None or not grade.completed:
            sets["error"].add(ident)
            continue
        sets["completed"].add(ident)
        sets["resolved" if grade.resolved else "unresolved"].add(ident)
    counts = {f"{name}_instances": len(sets[name]) for name in ("completed", "resolved", "unresolved",
                                                                "empty_patch", "error")}
    return {
        "total_instances": len(ids),
        "submitted_instances": len(predictions),
        **counts,
        **{f"{name}_ids": sorted(sets[name]) for name in ("completed", "incomplete", "empty_patch")},
        "submitted_ids": sorted(predictions),
        **{f"{name}_ids": sorted(sets[name]) for name in ("resolved", "unresolved", "error")},
        "schema_version": 2,
    }


def write_run_report(root: str | Path, model: str, run_id: str, summary: Mapping[str, Any]) -> Path:
    """The run summary as the harness names it: ``<root>/<model with / as __>.<run_id>.json``."""
    path = Path(root) / f"{model.replace('/', '__')}.{run_id}.json"
    _write_atomic(path, json.dumps(dict(summary), indent=4) + "\n")
    return path


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, text.encode("utf-8"))
