"""The config floor: a run config's schema (``run_config``) and its run-level sections, under everything that reads
them. A component section's schema lives beside its component (the ``serve`` section's in ``cluster.serving``); this
package is where callers above find every section of a run config."""

from cluster.config.gym_section import GymSection
from cluster.config.run_config import DatasetConfig, FarmConfig, RunConfig
from cluster.serving.config import ServeSection

__all__ = ["DatasetConfig", "FarmConfig", "GymSection", "RunConfig", "ServeSection"]
