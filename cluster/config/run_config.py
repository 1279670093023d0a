"""The schema of a run config (``rollout run CONFIG``): one section per component.

Component sections (``model``, ``agent``, ``environment``, ``runtime``, ``verifier``) pick an
implementation by ``type`` (a short name or a dotted path) and are validated by that
implementation's own ``<Class>Config``; ``cluster.compose`` does that before any work starts.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from cluster import names
from cluster.config.gym_section import GymSection
from cluster.placement.adaptive import WINDOW
from cluster.serving.config import ServeSection
from cluster.serving.kinds import app_for
from cluster.session.home import in_ray_job
from cluster.transfer.setup import ImagesSection
from rollout.config.load import StrictModel
from rollout.config.retype import LoadedConfig, apply_retypes
from rollout.data.paths import name_problem
from rollout.errors import ConfigError

COMPONENTS = ("model", "agent", "environment", "runtime", "verifier")
"""The sections that pick an implementation by ``type``, at the top level and under ``profiles.<name>``."""


class DatasetConfig(StrictModel):
    type: Literal["rows", "harbor"] = "rows"
    """``rows``: a file of rows (JSONL, a JSON list, ``hf://``). ``harbor``: a directory of Harbor tasks, or one task
    (``envs.harbor``: run with ``environment.type harbor`` and ``verifier.type harbor``)."""
    path: str
    """JSONL (one task per line) or a JSON list, or a Harbor task directory; relative paths are relative to the
    config file."""
    ids: list[str] | None = None
    """Only these task ids."""
    pattern: str | None = None
    """Only task ids matching this regular expression."""
    slice: str | None = None
    """Python-style slice of the (filtered) tasks, e.g. ``"0:10"``."""
    generate: str | None = None
    """Dotted path of ``fn(out_dir) -> path`` that (re)writes the dataset before loading (cached by the
    generator), e.g. ``envs.swe.mini:build`` for the bundled SWE benchmark."""
    allow_outside_paths: bool = False
    """Let a row's ``repo_path`` be absolute or lead out of the dataset's directory. Off: such a row is refused
    when the dataset loads, so a dataset from elsewhere cannot make the farm read or copy any host path."""


class RunOptions(StrictModel):
    samples: int = Field(default=1, ge=1)
    """Rollouts per task (n samples, each with its own seed)."""
    concurrency: int = Field(default=8, ge=1)
    """Rollouts in flight at once."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per (task, sample) when infrastructure fails; task outcomes are never retried."""
    seed: int = 0
    """Base seed: sample i of a task gets ``seed + i``."""
    progress_interval: float = Field(default=5.0, gt=0)
    """Seconds between progress lines."""


class OutputConfig(StrictModel):
    dir: str | None = None
    """Run directory; relative to ``$ROLLOUT_HOME`` (default ``./runs``); default: the run id."""
    trajectories: bool = True
    """Write one trajectory JSON per rollout, updated as it goes."""
    trajectory_format: Literal["farm", "atif"] = "farm"
    """``atif``: also write each finished rollout as an ATIF-v1.8 file beside its trajectory (``<name>.atif.json``,
    ``rollout.formats``); ``rollout export RUN --format atif`` writes them for a finished run."""


class FarmConfig(StrictModel):
    """Where rollouts execute: in this process (``local``) or on worker actors of a Ray cluster (``ray``)."""

    backend: Literal["ray", "local"] = "ray"
    """``ray``: worker actors, one per node, on the cluster ``address`` names (an embedded local cluster when
    neither it nor ``RAY_ADDRESS`` is set). ``local``: asyncio tasks in the driver's process (tests, debugging)."""
    address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``, ``host:6379``); default ``$RAY_ADDRESS``, else embedded."""
    num_cpus: int | None = Field(default=None, ge=1)
    """CPUs of the embedded cluster (default: the machine's)."""
    cpus_per_rollout: float | None = Field(default=None, gt=0)
    """CPUs one rollout's container takes; default the runtime's ``cpus`` (none for runtimes without containers)."""
    memory_per_rollout: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$")
    """Memory one rollout's container takes; default the runtime's ``memory``."""
    max_per_node: int | None = Field(default=None, ge=1)
    """Cap on concurrent rollouts per node, on top of what cpus and memory allow."""
    adaptive: bool = False
    """Find each node's limit by measuring (``cluster.placement.adaptive``, the ray backend): it starts low (2 per
    CPU, at least 4), grows while the node's completions/s rise or hold, and is cut x0.7 when they fall clearly or
    its sandboxes' start latency climbs; never above the node's slots (the keys above, ``run.concurrency``)."""
    adaptive_window: float = Field(default=WINDOW, gt=0)
    """Seconds the adaptive limit measures over at least before each decision (longer when the rollouts take
    longer)."""
    workers_per_node: int | None = Field(default=None, ge=1)
    """Worker processes per node, each one event loop sharing the node's slots. Default: one per 1,000 slots,
    at most one per CPU (one loop runs about a thousand steps a second)."""
    deadline: float | None = Field(default=None, gt=0)
    """Host-side seconds per attempt (container start, agent, grading); the attempt is cancelled and its
    containers removed when it passes. Default: the agent's ``time_limit`` plus its ``model_time_limit`` plus the
    verifier's ``eval_timeout`` plus 300 s, or none when the agent has no time limit."""
    dashboard: bool = False
    """Start the Ray dashboard with the embedded cluster."""
    keep_workers_idle: float | None = Field(default=None, ge=0)
    """On a cluster the run joins (``address``), keep its worker actors after it for a later run built the same
    way (``cluster.workers.kept``), and end each after this many idle seconds. Default: 600 when ``serve.keep`` is
    set, else off; 0: off. Never on the embedded cluster a run starts (it stops with the run)."""
    node_resources: dict[str, float] = Field(default_factory=dict)
    """Ray custom resources a node must offer to host rollout workers, e.g. ``{sandbox: 1}`` on a cluster whose
    model nodes run no sandboxes (a node without them, the head included, gets no worker). Default: every node
    with CPUs."""

    @property
    def joins_cluster(self) -> bool:
        """A ray backend on a cluster that other nodes may be part of (given, from the environment, or a job's):
        what the run serves itself (a ``fake_server``) must answer on the node's address, not 127.0.0.1."""
        return self.backend == "ray" and bool(self.address or os.environ.get("RAY_ADDRESS") or in_ray_job())


class Profile(StrictModel):
    """Section overrides for tasks whose ``profile`` field names this profile."""

    agent: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    runtime: dict[str, Any] | None = None
    verifier: dict[str, Any] | None = None


class RunConfig(StrictModel):
    run_id: str | None = None
    """Default: the (first) config file's stem. One directory level: no / or \\, not . or .."""

    @field_validator("run_id")
    @classmethod
    def _one_level(cls, value: str | None) -> str | None:
        problem = None if value is None else name_problem(value)
        if problem:
            raise ValueError(problem)
        return value
    model: dict[str, Any]
    agent: dict[str, Any] = Field(default_factory=lambda: {"type": "tool_calling"})
    environment: dict[str, Any] = Field(default_factory=lambda: {"type": "shell"})
    runtime: dict[str, Any] | None = None
    verifier: dict[str, Any] | None = None
    profiles: dict[str, Profile] = Field(default_factory=dict)
    dataset: DatasetConfig
    run: RunOptions = Field(default_factory=RunOptions)
    output: OutputConfig = Field(default_factory=OutputConfig)
    farm: FarmConfig = Field(default_factory=FarmConfig)
    gym: GymSection | None = None
    """The NeMo-Gym-compatible agent server (``rollout gym serve``): address, episode limits."""
    images: ImagesSection = Field(default_factory=ImagesSection)
    """How images reach the nodes: a registry, and/or the driver machine's daemon through the object store."""
    serve: ServeSection | None = None
    """The model on Ray Serve for this run (``cluster.serving``): deployed when the run starts, its URL given to
    the model client, deleted when the run ends."""

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        """``fake_server: {policy, latency, faults}``, the old spelling of a scripted policy played in this process,
        is read as ``serve: {app: scripted, in_process: true, ...}`` (run directories written with it resume).
        Defined first, so that it runs last: after ``model.serve`` joined the top level."""
        if isinstance(data, dict) and data.get("fake_server") is not None:
            if data.get("serve") is not None:
                raise ValueError("serve and fake_server both serve the run's model: keep one (serve: {app: scripted, "
                                 "in_process: true} is what fake_server spells)")
            old = data["fake_server"]
            if not isinstance(old, dict):
                raise ValueError("fake_server: a section (policy, latency, faults)")
            data = {**data, "serve": {"app": "scripted", "in_process": True, **old}}
        if isinstance(data, dict) and "fake_server" in data:
            data = {key: value for key, value in data.items() if key != "fake_server"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _serve_in_model(cls, data: Any) -> Any:
        """``model: {serve: {...}}`` is the same as a top-level ``serve`` section (the model and where it runs,
        side by side)."""
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and "serve" in data["model"]:
            model = dict(data["model"])
            nested = model.pop("serve")
            if data.get("serve") is not None and nested is not None:
                raise ValueError("serve is given twice (model.serve and serve): keep one")
            data = {**data, "model": model, "serve": nested if nested is not None else data.get("serve")}
        return data

    @model_validator(mode="before")
    @classmethod
    def _retyped(cls, data: Any) -> Any:
        """Sections whose ``type`` an override changed lose the keys the new type does not take, with a note on
        stderr (``rollout.config.retype``). Defined after ``_serve_in_model`` so that it runs first (pydantic runs the
        last ``before`` validator first), on what ``load_config`` returned."""
        if isinstance(data, LoadedConfig):
            for note in apply_retypes(data, section_keys):
                print(note, file=sys.stderr, flush=True)
        return data

    @property
    def played_here(self) -> ServeSection | None:
        """The scripted policy played on this process's event loop instead of deployed: ``serve.in_process``, or a
        scripted app under ``farm.backend: local`` (a local run starts no Ray); None otherwise."""
        serve = self.serve
        if serve is None or app_for(serve).in_process(serve) is None:
            return None
        return serve if serve.in_process or self.farm.backend == "local" else None

    @property
    def deployed(self) -> ServeSection | None:
        """The ``serve`` section deployed on Serve when the run starts; None without one, or when it is played here."""
        return self.serve if self.played_here is None else None

    @staticmethod
    def upgrade(stored: dict[str, Any]) -> dict[str, Any]:
        """A resolved config a run directory stored, as this version writes it (old spellings read as today's), for
        a resumed run to compare with its own; as stored when it no longer validates (the comparison names what
        changed)."""
        try:
            upgraded = RunConfig.model_validate(stored).model_dump(mode="json")
        except (ValueError, ConfigError):
            return stored
        upgraded["dataset"]["path"] = stored.get("dataset", {}).get("path", upgraded["dataset"]["path"])
        return upgraded


def section_keys(path: tuple[str, ...], type_name: Any) -> set[str] | None:
    """The keys a component section (``runtime``, ``profiles.<name>.agent``, ...) of this type accepts: the fields
    of the implementation's ``<Class>Config``. None when ``path`` is no component section, the type does not load
    (validation names it) or the class has no config model."""
    if path[-1] not in COMPONENTS or len(path) not in (1, 3) or (len(path) == 3 and path[0] != "profiles"):
        return None

    registry = {"model": names.MODELS, "agent": names.AGENTS, "environment": names.ENVIRONMENTS,
                "runtime": names.RUNTIMES, "verifier": names.VERIFIERS}[path[-1]]
    if path[-1] == "runtime" and type_name == "auto":  # per-runtime sub-sections (cluster.run.host_checks)
        return {"type", *registry.names()}
    try:
        cls = registry.load(str(type_name), field=".".join(path + ("type",)))
    except ConfigError:
        return None
    config_cls = getattr(sys.modules[cls.__module__], f"{cls.__name__}Config", None)
    if not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel)):
        return None
    keys = {name for name in config_cls.model_fields} | {f.alias for f in config_cls.model_fields.values() if f.alias}
    return keys | ({"serve"} if path[-1] == "model" else set())  # model.serve: the run's serve section
