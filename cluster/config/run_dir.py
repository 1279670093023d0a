"""A run's directory: ``output.dir`` or the run id, under ``$ROLLOUT_HOME`` (``cluster.session.home``)."""

from __future__ import annotations

from pathlib import Path

from cluster.config.run_config import RunConfig
from cluster.session.home import rollout_home
from rollout.config.load import parse_override


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
