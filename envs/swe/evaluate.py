"""evaluate: grade a SWE-bench predictions file against a dataset, in parallel, writing the harness's reports."""

from __future__ import annotations

import asyncio
import shutil
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from envs.images.base_image import ensure_image, image_present
from envs.images.daemon import ImageError, docker_client
from envs.images.image_names import DEFAULT_BASE_IMAGE, NAME_FIELDS, image_for
from envs.images.instance_images import build_instance_images
from envs.runtimes.apptainer.runtime import ApptainerRuntime
from envs.runtimes.docker.runtime import DockerRuntime
from envs.runtimes.local import LocalRuntime
from envs.runtimes.prepared import PreparedRepoRuntime
from envs.swe.env import check_grading_fields
from envs.swe.grading.grade import grade
from envs.swe.reports.harness import (
    KEY_MODEL,
    KEY_PREDICTION,
    Grade,
    instance_log_dir,
    load_predictions,
    run_summary,
    write_instance_report,
    write_run_report,
)
from rollout.data.dataset import load_tasks
from rollout.data.paths import name_problem
from rollout.errors import ConfigError
from rollout.protocols import Runtime
from rollout.records import Task

RuntimeKind = Literal["docker", "apptainer", "local"]
LOCAL_REPO_DIR = "testbed"
"""Where the repository is cloned in a local workspace (the images have it at /testbed)."""
LOCAL_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
"""Over the host's environment for local grading: pytest as in an instance image, without the host's
plugins (which can change the statuses, and cost a second per run), and no bytecode in the repository."""
DEFAULT_MODEL = "model"
"""The model name in report paths when neither the caller nor the predictions give one."""


async def evaluate(dataset_path: str | Path, predictions_path: str | Path, *, run_id: str, out_root: str | Path,
                   runtime: RuntimeKind = "docker", workers: int = 2, eval_timeout: float = 1800,
                   model_name: str | None = None, progress: Callable[[str], Any] = print,
                   base_image: str = DEFAULT_BASE_IMAGE, local_env: Mapping[str, str] = LOCAL_ENV,
                   allow_outside_paths: bool = False) -> dict[str, Any]:
    """Grade every non-empty prediction for an instance of the dataset, ``workers`` at a time, each in a
    fresh runtime: a container of the instance's image (``runtime="docker"``; missing images of rows with
    ``repo_path`` are built first), an apptainer instance of that image (``"apptainer"``: converted once per node
    from this node's docker) or a host workspace with ``repo_path`` cloned at ``base_commit``
    (``"local"``: the dataset's own test commands run unisolated on this host). Writes each instance's
    ``logs/run_evaluation/<run_id>/<model>/<instance_id>/`` files and ``<model>.<run_id>.json`` under
    ``out_root``; returns that run report. Bad input (files, unknown ids, a row the runtime cannot grade) is
    a ``ConfigError`` before any grading; an instance whose grading fails is an error in the report.
    ``local_env``: environment variables of the local runtime's commands, over the host's.
    ``allow_outside_paths``: ``repo_path`` may be absolute or lead out of the dataset's directory."""
    if runtime not in ("docker", "apptainer", "local"):
        raise ConfigError(f"must be docker, apptainer or local, got {runtime!r}", "runtime")
    if workers < 1:
        raise ConfigError(f"must be at least 1, got {workers}", "workers")
    problem = name_problem(run_id)
    if problem:
        raise ConfigError(problem, "run_id")
    tasks = load_tasks(dataset_path, check_grading_fields, allow_outside_paths=allow_outside_paths)
    predictions = load_predictions(predictions_path)
    by_id = {t.task_id: t for t in tasks}
    unknown = sorted(set(predictions) - set(by_id))
    if unknown:
        raise ConfigError(f"{len(unknown)} prediction(s) for instances not in the dataset: {', '.join(unknown[:5])}",
                          str(predictions_path))
    model = model_name or next((str(p[KEY_MODEL]) for p in predictions.values() if p.get(KEY_MODEL)), DEFAULT_MODEL)
    problem = name_problem(model.replace("/", "__"))  # a directory of the report tree
    if problem:
        raise ConfigError(f"the model name: {problem}",
                          "--model" if model_name else str(predictions_path))
    todo = [by_id[i] for i in predictions if predictions[i].get(KEY_PREDICTION) not in ("", None)]
    for ident in sorted(set(predictions) - {t.task_id for t in todo}):
        progress(f"{ident}: empty patch, not evaluated")
    if runtime == "local":
        missing = [t.task_id for t in todo if not t.data.get("repo_path")]
        if missing:
            raise ConfigError(f"the local runtime clones each instance's repo_path; these rows have none: "
                              f"{', '.join(missing[:5])} (grade them with --runtime docker)", str(dataset_path))
    elif todo:
        await asyncio.to_thread(_ensure_images, Path(dataset_path), todo, base_image, workers, progress)

    out_root = Path(out_root)
    gate = asyncio.Semaphore(workers)
    grades: dict[str, Grade] = {}
    counter = {"done": 0}

    async def one(task: Task) -> None:
        patch = predictions[task.task_id][KEY_PREDICTION]
        async with gate:
            began = time.monotonic()
            # A report.json left by an earlier evaluation under this run id must not outlive this one.
            shutil.rmtree(instance_log_dir(out_root, run_id, model, task.task_id), ignore_errors=True)
            try:
                graded = await grade({"instance_id": task.task_id, **task.data}, patch,
                                     _factory(task, runtime, run_id, eval_timeout, base_image, local_env),
                                     eval_timeout=eval_timeout, repo_dir="/testbed" if runtime != "local"
                                     else LOCAL_REPO_DIR)
            except Exception as exc:  # noqa: BLE001 - one instance's failure is a line in the report, not the end
                _write_error(out_root, run_id, model, task.task_id, patch, exc)
                outcome = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            else:
                grades[task.task_id] = graded
                write_instance_report(out_root, run_id, model, task.task_id, graded, patch)
                outcome = _outcome(graded)
            counter["done"] += 1
            progress(f"[{counter['done']}/{len(todo)}] {task.task_id}: {outcome} ({time.monotonic() - began:.1f}s)")

    await asyncio.gather(*(one(t) for t in todo))
    summary = run_summary([t.task_id for t in tasks], predictions, grades)
    path = write_run_report(out_root, model, run_id, summary)
    progress(f"run report: {path}")
    return summary


def _factory(task: Task, runtime: RuntimeKind, run_id: str, eval_timeout: float, base_image: str,
             local_env: Mapping[str, str]) -> Callable[[], Runtime]:
    """A fresh, unstarted runtime per call: grading never reuses one."""
    if runtime == "docker":
        config = {"image": image_for(task, base_image), "workdir": "/testbed", "timeout": eval_timeout}
        return lambda: DockerRuntime(config, run_id=run_id, rollout_id=f"eval-{task.task_id}")
    if runtime == "apptainer":
        config = {"image": image_for(task, base_image), "workdir": "/testbed", "timeout": eval_timeout}
        return lambda: ApptainerRuntime(config, run_id=run_id)
    # trusted_model: the commands run are the dataset's own test commands, not a model's.
    local = {"timeout": eval_timeout, "env": dict(local_env)}
    return lambda: PreparedRepoRuntime(LocalRuntime(local, trusted_model=True),
                                       task.data["repo_path"], str(task.data.get("base_commit") or "HEAD"),
                                       LOCAL_REPO_DIR)


def _ensure_images(dataset_path: Path, tasks: list[Task], base: str, workers: int,
                   progress: Callable[[str], Any]) -> None:
    """Every task's image present: build the missing ones from their repo_path (the whole dataset's missing
    images, built in parallel), find or pull the others; an ``ImageError`` names what cannot be had."""
    client = docker_client()
    missing = [t for t in tasks if not image_present(client, image_for(t, base))]
    buildable = [t for t in missing if t.data.get("repo_path") and not any(t.data.get(k) for k in NAME_FIELDS)]
    if buildable:
        progress(f"building {len(buildable)} missing instance image(s) from {base}")
        report = build_instance_images(dataset_path, base=base, parallelism=workers, progress=progress)
        wanted = {t.task_id for t in buildable}
        failed = [f"{ident}: {error.splitlines()[0] if error else ''}" for ident, error in report.failed
                  if ident in wanted]
        if failed:
            raise ImageError(f"cannot build the image of {len(failed)} instance(s): " + "; ".join(failed[:3]))
    built = {t.task_id for t in buildable}
    for task in missing:
        if task.task_id not in built:
            ensure_image(image_for(task, base), client, log=progress)  # pulled, or an ImageError naming it


def _outcome(graded: Grade) -> str:
    if not graded.patch_successfully_applied:
        return "the patch did not apply"
    if graded.timed_out:
        return "tests timed out"
    return "resolved" if graded.resolved else "unresolved"


def _write_error(root: Path, run_id: str, model: str, ident: str, patch: str, exc: BaseException) -> None:
    """The instance's directory as the harness leaves it after an error: the patch and a log saying why."""
    where = instance_log_dir(root, run_id, model, ident)
    where.mkdir(parents=True, exist_ok=True)
    (where / "patch.diff").write_text(patch or "", encoding="utf-8")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    (where / "run_instance.log").write_text(f"instance: {ident}\noutcome: error\n\n{text}", encoding="utf-8")
