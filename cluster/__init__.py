"""cluster: everything Ray (the only package that imports ray): the farm's workers and driver, the trainer
API (``from cluster import RolloutFarm``), the CLI and job entry point. Importing it starts nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["RolloutFarm"]


def __getattr__(name: str) -> Any:
    if name == "RolloutFarm":  # loaded on first use: ``import cluster`` stays cheap for the CLI
        from cluster.farm.rollout_farm import RolloutFarm

        return RolloutFarm
    raise AttributeError(f"module 'cluster' has no attribute {name!r}")
