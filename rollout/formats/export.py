"""A run directory's rollouts in another format: ATIF files (one per rollout), or SFT rows (one JSONL line per
rollout, ``sharegpt`` or ``hf``). Read-only on the run: results.jsonl is parsed, never repaired, so an export may run
beside the run that writes it. ``write_beside`` writes a finished rollout's ATIF file next to its trajectory file.

Which agent produced a rollout comes from the run's config (``config.json``): ``agent.type``, or the type of the
profile its task names (``AgentNames``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rollout.data.dataset import load_tasks
from rollout.data.paths import id_problem
from rollout.formats.atif import AtifAgent, to_atif
from rollout.formats.sharegpt import trace_row
from rollout.records import RolloutResult, Task, Trajectory
from rollout.store.files import StoredResult, parse_results, safe_name, write_bytes, write_json
from rollout.store.resume import latest_per_key

FORMATS = ("atif", "sharegpt", "hf")
"""``atif``: one ATIF-v1.8 file per rollout; ``sharegpt``: Harbor's trace rows with ``conversations_sharegpt``;
``hf``: the same rows without it."""
ATIF_SUFFIX = ".atif.json"


class AgentNames:
    """Who ran each rollout of a run, from its resolved config: the agent's type (per profile), the model's name,
    the farm's version (from the manifest)."""

    def __init__(self, config: dict[str, Any], profiles: dict[str, str | None] | None = None,
                 version: str = "unknown"):
        self.default = str((config.get("agent") or {}).get("type") or "tool_calling")
        self.types = {name: str(((section or {}).get("agent") or {}).get("type") or self.default)
                      for name, section in (config.get("profiles") or {}).items()}
        self.profiles = profiles or {}
        """Task id -> the profile its row names (None: the top-level sections)."""
        model, serve = config.get("model") or {}, config.get("serve") or {}
        self.model = model.get("model") or serve.get("model_id") or model.get("policy") or model.get("type")
        self.version = version

    @classmethod
    def of_run(cls, run_dir: str | Path, tasks: Iterable[Task] | None = None,
               warn: Callable[[str], None] = lambda _: None) -> AgentNames:
        """From a run directory's config.json and manifest.json. A config with profiles needs each task's profile:
        from ``tasks``, else from the dataset file the config names (when it cannot be read, ``warn`` says so and
        every rollout is named after the top-level agent)."""
        config, manifest = _read(Path(run_dir) / "config.json"), _read(Path(run_dir) / "manifest.json")
        profiles: dict[str, str | None] = {}
        if config.get("profiles"):
            if tasks is None:
                try:
                    tasks = load_tasks((config.get("dataset") or {})["path"], allow_outside_paths=True)
                except Exception as exc:  # noqa: BLE001 - the names are a courtesy; the export goes on
                    warn(f"task profiles unknown ({type(exc).__name__}: {exc}): every rollout is named after "
                         "agent.type")
                    tasks = []
            profiles = {task.task_id: task.data.get("profile") for task in tasks}
        return cls(config, profiles, str(manifest.get("version") or "unknown"))

    def __call__(self, result: RolloutResult) -> AtifAgent:
        profile = self.profiles.get(result.task_id)
        name = self.types.get(profile, self.default) if profile else self.default
        return AtifAgent(name=name, version=self.version, model_name=self.model,
                         extra={"farm": "rollout-farm", **({"profile": profile} if profile else {})})


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Exported:
    """What an export wrote, and the rollouts it left out (rollout id, why)."""

    paths: list[Path] = field(default_factory=list)
    rows: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)


def rollouts(run_dir: str | Path) -> Iterator[RolloutResult | tuple[str, str]]:
    """The latest attempt of each (task, sample) with its trajectory, in results order; ``(rollout id, why)`` for
    one whose trajectory file is missing or unreadable."""
    run_dir = Path(run_dir)
    for stored in latest_per_key(parse_results(run_dir / "results.jsonl").results):
        assert isinstance(stored, StoredResult)
        path = run_dir / stored.trajectory_path
        try:
            trajectory = Trajectory.model_validate(json.loads(path.read_text())["trajectory"])
        except (OSError, ValueError, KeyError) as exc:
            yield stored.rollout_id, f"no trajectory ({path.name}: {type(exc).__name__})"
            continue
        fields = {name: getattr(stored, name) for name in RolloutResult.model_fields if name != "trajectory"}
        yield RolloutResult(**fields, trajectory=trajectory)


def file_name(rollout_id: str) -> str:
    """An ATIF file's name: the rollout id (``task#sample``) when it is a safe name, else a safe form of it."""
    stem = rollout_id if id_problem(rollout_id) is None else safe_name(rollout_id)
    return stem + ".json"


def export_run(run_dir: str | Path, fmt: str, out: str | Path, agent_for: Callable[[RolloutResult], AtifAgent],
               ) -> Exported:
    """Write the run's rollouts in ``fmt`` under ``out`` (a directory): ``<rollout id>.json`` per rollout for
    ``atif``, ``<fmt>.jsonl`` for the row formats."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = Path(out)
    done, lines = Exported(), []
    for item in rollouts(run_dir):
        if isinstance(item, tuple):
            done.skipped.append(item)
            continue
        doc = to_atif(item, agent_for(item))
        if doc is None:
            done.skipped.append((item.rollout_id, "no message recorded"))
        elif fmt == "atif":
            path = out / file_name(item.rollout_id)
            write_json(path, doc, indent=None)
            done.paths.append(path)
        elif (row := trace_row(doc, sharegpt=fmt == "sharegpt")) is None:
            done.skipped.append((item.rollout_id, "no model call of its own"))
        else:
            lines.append(json.dumps(row, ensure_ascii=False))
    if fmt != "atif":
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{fmt}.jsonl"
        write_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8"))
        done.paths.append(path)
        done.rows = len(lines)
    return done


def atif_path(trajectory_path: Path) -> Path:
    """Where a trajectory file's ATIF file goes: beside it, ``<name>.atif.json``."""
    return trajectory_path.with_name(trajectory_path.name.removesuffix(".json") + ATIF_SUFFIX)


def write_beside(store: Any, result: RolloutResult, agent: AtifAgent) -> Path | None:
    """Write a finished rollout's ATIF file beside its trajectory file in ``store`` (a ``RunStore``); None when it
    recorded no message."""
    doc = to_atif(result, agent)
    if doc is None:
        return None
    path = atif_path(store.trajectory_path(result.rollout_id, result.attempt, result.task_id))
    write_json(path, doc, store.fsync, indent=None)
    return path


def atif_writer(store: Any, agent_for: Callable[[RolloutResult], AtifAgent],
                warn: Callable[[str], None]) -> Callable[[RolloutResult], None]:
    """A run's ``on_result``: each finished rollout's ATIF file beside its trajectory (``output.trajectory_format:
    atif``). A file that cannot be written is named through ``warn``; the run goes on."""

    def write(result: RolloutResult) -> None:
        try:
            write_beside(store, result, agent_for(result))
        except Exception as exc:  # noqa: BLE001 - an extra view of a rollout never stops the run
            warn(f"ATIF file of {result.rollout_id} not written: {type(exc).__name__}: {exc}")

    return write
