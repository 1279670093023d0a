"""The files SWE users already read, written at the end of a run: ``preds.json``, the official
harness's ``logs/run_evaluation/<run_id>/<model>/<instance_id>/`` reports, the run report, and each
trajectory in mini-swe-agent's ``.traj.json`` shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.swe.swe_reports import Grade, prediction, run_summary, write_instance_report, write_preds, write_run_report
from rollout.records import RolloutResult
from rollout.run_store import RunStore

GRADE_FIELDS = set(Grade.model_fields)


def is_swe_result(result: RolloutResult) -> bool:
    return "tests_status" in result.reward_details


def model_name(config: dict[str, Any]) -> str:
    model = config.get("model", {})
    return str(model.get("model") or model.get("policy") or model.get("type") or "model").replace("/", "__")


def write_swe_outputs(store: RunStore, run_id: str, model: str) -> dict[str, Any] | None:
    """Write every SWE output of the run from its latest results; None when the run had no SWE task."""
    latest = [r for r in store.latest_results() if r.status == "completed" and is_swe_result(r)]
    failed = [r for r in store.latest_results() if r.status != "completed"]
    if not latest:
        return None
    preds_by_sample: dict[int, dict[str, Any]] = {}
    for result in latest + failed:
        patch = result.reward_details.get("model_patch") if is_swe_result(result) else result.submission
        preds_by_sample.setdefault(result.sample_index, {})[result.task_id] = prediction(result.task_id, model, patch)
    for sample, preds in sorted(preds_by_sample.items()):
        write_preds(store.run_dir / ("preds.json" if sample == 0 else f"preds.sample{sample}.json"), preds)
    grades: dict[str, Any] = {}
    for result in latest:
        if result.sample_index != 0:
            continue
        grade = {k: v for k, v in result.reward_details.items() if k in GRADE_FIELDS}
        write_instance_report(store.run_dir, run_id, model, result.task_id, grade,
                              result.reward_details.get("model_patch"))
        grades[result.task_id] = grade
    ids = sorted({r.task_id for r in latest + failed})
    summary = run_summary(ids, preds_by_sample.get(0, {}), grades)
    write_run_report(store.run_dir, model, run_id, summary)
    _export_trajectories(store, latest)
    return summary


def _export_trajectories(store: RunStore, results: list[RolloutResult]) -> None:
    from envs.swe.traj_export import write_mini_swe_traj

    for result in results:
        full_path = store.trajectory_path(result.rollout_id, result.attempt, result.task_id)
        trajectory = store.load_trajectory(result)
        if trajectory is None:
            continue
        full = result.model_copy(update={"trajectory": trajectory})
        write_mini_swe_traj(Path(str(full_path).removesuffix(".json") + ".traj.json"), full)
