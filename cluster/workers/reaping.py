"""Removing a run's containers by label, for the driver (a dead worker's, a cancelled attempt's) and for a
worker on its own host. Failures are reported, never raised: the containers' TTL is the last line of defence."""

from __future__ import annotations

import sys
from typing import TextIO

from envs.runtimes.docker.containers import remove_labelled


def reap_dead_owners(run_id: str, engines: tuple[str, ...], out: TextIO | None = sys.stderr) -> int:
    """Remove containers of ``run_id`` whose creating process is gone; returns how many."""
    total = 0
    for engine in engines:
        try:
            removed = remove_labelled(run_id, engine=engine)
        except Exception as exc:  # noqa: BLE001 - reported; the TTL catches what this misses
            if out is not None:
                print(f"[farm] could not reap {engine} containers: {exc}", file=out, flush=True)
            continue
        if removed and out is not None:
            print(f"[farm] removed {len(removed)} {engine} container(s) of dead workers", file=out, flush=True)
        total += len(removed)
    return total


def remove_rollout_containers(run_id: str, engines: tuple[str, ...], rollout_id: str) -> None:
    """Remove every container of one rollout, live or not (an attempt cancelled at its deadline)."""
    for engine in engines:
        try:
            remove_labelled(run_id, engine=engine, rollout_id=rollout_id, include_live=True)
        except Exception:  # noqa: BLE001 - the TTL catches what this misses
            pass
