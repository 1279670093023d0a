"""Where runs go on this machine: ``$ROLLOUT_HOME`` (``./runs``; in a ``ray job submit`` driver ``~/rollout-farm/runs``,
the job's cwd being a throwaway copy), and whether this process is such a driver."""

from __future__ import annotations

import os
from pathlib import Path

JOB_ROLLOUT_HOME = "~/rollout-farm/runs"
"""Where runs go inside ``ray job submit`` when ``ROLLOUT_HOME`` is unset."""


def in_ray_job() -> bool:
    """True inside a driver started by ``ray job submit`` (Ray hands it the job's config in this variable)."""
    return bool(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def rollout_home() -> Path:
    home = os.environ.get("ROLLOUT_HOME") or (JOB_ROLLOUT_HOME if in_ray_job() else "runs")
    return Path(home).expanduser().resolve()
