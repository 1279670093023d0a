"""The files SWE users already read, written at the end of a run: ``preds.json``, the official
harness's ``logs/run_evaluation/<run_id>/<model>/<instance_id>/`` reports, the run report, and each
trajectory as mini-swe-agent 2.4.6 saves it: ``trajectories/<instance_id>/<instance_id>.traj.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from cluster.compose import component
from cluster.names import AGENTS, ENVIRONMENTS, MODELS, with_policy_path
from envs.swe.reports.harness import (
    Grade,
    prediction,
    run_summary,
    write_instance_report,
    write_preds,
    write_run_report,
)
from envs.swe.reports.traj_export import write_mini_swe_traj
from rollout.errors import ConfigError
from rollout.records import RolloutResult
from rollout.store.files import safe_name
from rollout.store.run_dir import RunStore

GRADE_FIELDS = set(Grade.model_fields)


def is_swe_result(result: RolloutResult) -> bool:
    return "tests_status" in result.reward_details


def model_name(config: dict[str, Any]) -> str:
    model = config.get("model", {})
    return str(model.get("model") or model.get("policy") or model.get("type") or "model").replace("/", "__")


def write_swe_outputs(store: RunStore, run_id: str, model: str,
                      results: list[RolloutResult] | None = None) -> dict[str, Any] | None:
    """Write every SWE output of the run from its latest results (``results``, when the caller has them: a store
    that does not keep its lines reads results.jsonl for them); None when the run had no SWE task."""
    if results is None:
        results = store.latest_results()
    latest = [r for r in results if r.status == "completed" and is_swe_result(r)]
    failed = [r for r in results if r.status != "completed"]
    if not latest:
        return None
    preds_by_sample: dict[int, dict[str, Any]] = {}
    for result in latest + failed:
        patch = result.reward_details.get("model_patch") if is_swe_result(result) else result.submission
        # no patch is "", as mini-swe-agent writes it (the harness reads "" and null alike: an empty patch)
        preds_by_sample.setdefault(result.sample_index, {})[result.task_id] = prediction(result.task_id, model,
                                                                                         patch or "")
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
    _export_trajectories(store, latest + failed)
    return summary


def traj_path(store: RunStore, result: RolloutResult) -> Path:
    """``trajectories/<instance_id>/<instance_id>.traj.json`` (mini-swe-agent's name: its inspector shows the
    instance); sample k > 0 of an instance is ``<instance_id>.sample<k>.traj.json``, like ``preds.sample<k>.json``.
    One file per sample: its latest attempt (``info.attempt``); earlier attempts keep their ``.a<n>.json``."""
    folder = store.trajectory_path(result.rollout_id, result.attempt, result.task_id).parent
    sample = f".sample{result.sample_index}" if result.sample_index else ""
    return folder / f"{safe_name(result.task_id)}{sample}.traj.json"


def traj_config(store: RunStore) -> dict[str, Any] | None:
    """The run's config for ``info.config``: the agent, model and environment sections validated by their
    classes (defaults filled in, as mini-swe-agent dumps its config objects), each with ``<section>_type`` the
    class it names; a section that no longer validates is kept as written. None without a config.json."""
    try:
        raw = json.loads(store.config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    out = dict(raw)
    for section, registry in (("agent", AGENTS), ("model", MODELS), ("environment", ENVIRONMENTS)):
        try:
            comp = component(registry, with_policy_path(raw.get(section), f"{section}.policy"), section)
        except ConfigError:
            continue
        if comp is None:
            continue
        config = comp.config
        out[section] = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)
        out[f"{section}_type"] = f"{comp.cls.__module__}.{comp.cls.__name__}"
    return out


def _export_trajectories(store: RunStore, results: list[RolloutResult]) -> None:
    """Each result's trajectory as a ``.traj.json``; none for a rollout that never reached its first message
    (mini-swe-agent writes none when its environment does not start). Exports under the names used before
    (``<sample>.a<attempt>.traj.json``, beside the raw trajectory) are removed first."""
    for result in results:
        for attempt in range(1, result.attempt + 1):
            raw_path = store.trajectory_path(result.rollout_id, attempt, result.task_id)
            Path(str(raw_path).removesuffix(".json") + ".traj.json").unlink(missing_ok=True)
    config = traj_config(store)
    for result in results:
        trajectory = store.load_trajectory(result)
        if trajectory is None or not trajectory.messages:
            continue
        full = result.model_copy(update={"trajectory": trajectory})
        write_mini_swe_traj(traj_path(store, result), full, config=config)
