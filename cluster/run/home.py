"""Where runs go: ``$ROLLOUT_HOME`` (``./runs``; in a ``ray job submit`` driver ``~/rollout-farm/runs``, the
job's cwd being a throwaway copy) and a run's directory under it."""

from __future__ import annotations

import os
from pathlib import Path

from cluster.run.config import RunConfig
from rollout.config.load import parse_override

JOB_ROLLOUT_HOME = "~/rollout-farm/runs"
"""Where runs go inside ``ray job submit`` when ``ROLLOUT_HOME`` is unset."""


def in_ray_job() -> bool:
    """True inside a driver started by ``ray job submit`` (Ray hands it the job's config in this variable)."""
    return bool(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def rollout_home() -> Path:
    home = os.environ.get("ROLLOUT_HOME") or (JOB_ROLLOUT_HOME if in_ray_job() else "runs")
    return Path(home).expanduser().resolve()


def resolve_run_dir(config: RunConfig, run_id: str, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """``output.dir``, else the run id; relative to ``$ROLLOUT_HOME``. A ``run_id=`` among the command line's
    ``overrides`` names a run of its own when only a config file sets ``output.dir``: ``<output.dir's parent>/<run_id>``
    (else the same command with another run id would resume the file's run). ``output.dir`` given on the command
    line too wins."""
    given = {".".join(parse_override(text)[0]) for text in overrides}
    out = Path(config.output.dir or run_id).expanduser()
    if config.output.dir and "run_id" in given and not given & {"output", "output.dir"}:
        out = out.parent / run_id
    return out if out.is_absolute() else rollout_home() / out
