"""Harbor 0.25.0 reads what we write, from a venv of its own (``foreign_venvs.HARBOR``; the session fixture
``harbor`` gives its python): its ATIF models and validator load our trajectory files, its trace export turns them
into rows, its ``TaskConfig`` reads task.toml files (through ``foreign_venvs.run_function``).

One module on the way of the trace export is not 3.11 syntax: ``harbor.utils.traces_utils`` imports the agent
factory, whose agents use 3.12 f-strings; the trace export never calls the factory, so the child puts an empty
``harbor.agents.factory`` module in its place and runs Harbor's own extraction functions unchanged.

Run as a script inside that venv, this file is the child: ``validate`` (paths in, each file's validator errors
out) or ``traces`` (paths in, Harbor's last-episode row of each). It imports only the standard library (and
``foreign_venvs``, which does too) at the top level, for that reason."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from foreign_venvs import MARK, answer


def validate(python: Path, paths: list[Path]) -> dict[str, list[str]]:
    """Harbor's ``TrajectoryValidator`` on each file, in one child: path -> its errors ([] when valid)."""
    return _child(python, "validate", [str(p) for p in paths])


def traces(python: Path, paths: list[Path]) -> dict[str, dict[str, Any] | None]:
    """Harbor's trace export of each ATIF file (``extract_conversations_from_trajectory``, the last episode, as
    ``harbor traces export --episodes last`` keeps it): path -> its row, or None when Harbor finds no episode."""
    return _child(python, "traces", [str(p) for p in paths])


def _child(python: Path, mode: str, request: Any) -> Any:
    with tempfile.TemporaryDirectory(prefix="harbor-") as where:  # the child's cwd: nothing of ours on its path
        out = subprocess.run([str(python), str(Path(__file__).resolve()), mode], input=json.dumps(request),
                             capture_output=True, text=True, timeout=300, cwd=where)
    return answer(out, f"Harbor's {mode}")


# ---- the child, run by the venv's python ----------------------------------------------------------------------------


def _validate(paths: list[str]) -> dict[str, list[str]]:
    from harbor.utils.trajectory_validator import TrajectoryValidator

    found = {}
    for path in paths:
        validator = TrajectoryValidator()
        found[path] = [] if validator.validate(Path(path)) else list(validator.get_errors())
    return found


def _traces(paths: list[str]) -> dict[str, Any]:
    import types

    factory = types.ModuleType("harbor.agents.factory")  # 3.12-only syntax behind it; never called by the export
    factory.AgentFactory = None  # type: ignore[attr-defined]
    sys.modules["harbor.agents.factory"] = factory
    from harbor.utils.traces_utils import extract_conversations_from_trajectory

    meta = {"agent_name": None, "model_name": None, "model_provider": None, "start_time": None, "run_id": None}
    rows = {}
    for path in paths:
        episodes = extract_conversations_from_trajectory(Path(path), meta)
        rows[path] = episodes[-1] if episodes else None
    return rows


if __name__ == "__main__":
    found = {"validate": _validate, "traces": _traces}[sys.argv[1]](json.loads(sys.stdin.read()))
    print(MARK + json.dumps(found))
