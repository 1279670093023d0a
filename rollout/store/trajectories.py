"""A run directory's trajectory files: ``trajectories/<task>/<rollout>.a<attempt>.json``, one per attempt,
rewritten atomically while the rollout runs (``"final": false``) and once more with the whole result
(``"final": true``). ``RunStore`` (``run_dir``) is the one writer."""

from __future__ import annotations

import json
from pathlib import Path

from rollout.records import RequestMeta, RolloutResult, Trajectory
from rollout.store.files import safe_name, write_json


class TrajectoryFiles:
    """The trajectory half of ``RunStore``, which sets ``trajectories_dir`` and ``fsync``."""

    trajectories_dir: Path
    fsync: bool

    def trajectory_path(self, rollout_id: str, attempt: int, task_id: str | None = None) -> Path:
        """``trajectories/<task id>/<rest of rollout id>.a<attempt>.json``, e.g. ``trajectories/t1/0.a1.json``.

        ``task_id`` defaults to the rollout id before its last '#' (rollout ids are ``<task>#<sample>``).
        Unsafe characters in ids are replaced (with a hash suffix, so distinct ids stay distinct).
        """
        task = task_id if task_id is not None else rollout_id.rsplit("#", 1)[0]
        rest = rollout_id[len(task) + 1 :] if rollout_id.startswith(task + "#") else rollout_id
        return self.trajectories_dir / safe_name(task) / f"{safe_name(rest)}.a{attempt}.json"

    def write_trajectory(self, result_or_meta: RolloutResult | RequestMeta,
                         trajectory: Trajectory | None = None) -> Path:
        """Atomically (re)write a rollout's trajectory file.

        Give the finished ``RolloutResult`` (the whole record is written, ``"final": true``), or
        while the rollout runs, its ``RequestMeta`` and the ``Trajectory`` so far (``"final": false``).
        A final result with an empty trajectory (a worker that died) keeps the steps already on disk.
        """
        if isinstance(result_or_meta, RolloutResult):
            r = result_or_meta
            path = self.trajectory_path(r.rollout_id, r.attempt, r.task_id)
            doc = {"final": True, **RolloutResult.model_dump(r, mode="json")}
            if not (r.trajectory.steps or r.trajectory.messages) and path.exists():
                doc["trajectory"] = json.loads(path.read_text()).get("trajectory", doc["trajectory"])
        else:
            m = result_or_meta
            doc = {
                "final": False,
                "run_id": m.run_id,
                "rollout_id": m.rollout_id,
                "task_id": m.task_id,
                "sample_index": m.sample_index,
                "attempt": m.attempt,
                "status": "running",
                "trajectory": (trajectory or Trajectory()).model_dump(mode="json"),
            }
            path = self.trajectory_path(m.rollout_id, m.attempt, m.task_id)
        write_json(path, doc, self.fsync, indent=None)  # rewritten every step: keep it compact
        return path

    def load_trajectory(self, result: RolloutResult) -> Trajectory | None:
        """The trajectory a results line points to, or None if its file is missing."""
        path = self.trajectory_path(result.rollout_id, result.attempt, result.task_id)
        try:
            return Trajectory.model_validate(json.loads(path.read_text())["trajectory"])
        except FileNotFoundError:
            return None
