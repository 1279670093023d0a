"""A separate virtualenv holding Harbor 0.25.0, so that software we did not write reads what we write: its ATIF
models and validator load our trajectory files, its trace export turns them into rows, its ``TaskConfig`` reads
task.toml files.

Harbor declares Python >= 3.12 and a long list of requirements (litellm, supabase, fastapi, ...), but the modules
checked here import on 3.11 with two packages: pydantic (the models) and toml (``harbor.models.task.config``). So
the wheel is fetched with ``pip download --no-deps --ignore-requires-python`` and installed with ``--no-deps``, then
``RUNTIME``. One module on the way is not 3.11 syntax: ``harbor.utils.traces_utils`` imports the agent factory,
whose agents use 3.12 f-strings; the trace export never calls the factory, so the child puts an empty
``harbor.agents.factory`` module in its place and runs Harbor's own extraction functions unchanged.

Use from any test (``tests/`` is on ``sys.path``): ``from harbor_venv import harbor_python, run_in_harbor`` and
a fixture of the test's own that returns ``harbor_python(pytestconfig, tmp_path_factory)``. The venv is built once
under pytest's cache directory (or ``$ROLLOUT_HARBOR_VENV``) under a file lock and reused while it imports; where it
cannot be built (no package index) the tests skip, or fail with ``ROLLOUT_REQUIRE_HARBOR=1`` (as in CI).

Run as a script inside that venv, this file is the child: ``validate`` (paths in, each file's validator errors
out) or ``traces`` (paths in, Harbor's last-episode row of each). It imports only the standard library at the top
level, for that reason."""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable

HARBOR = "harbor==0.25.0"
RUNTIME = ["pydantic==2.14.4", "toml==0.10.2"]
MODULES = ["harbor.models.trajectories", "harbor.utils.trajectory_validator", "harbor.models.task.config"]
PROBE = "import importlib\nfor m in %r: importlib.import_module(m)" % (MODULES,)
READY = "rollout-farm-ready.json"
MARK = "@@rollout-farm-harbor-answer@@ "


class HarborUnavailable(RuntimeError):
    """The venv could not be built (no network, no index, a package that will not install)."""


def _run(*args: str, timeout: float = 600, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=stdin)


def _check(out: subprocess.CompletedProcess, what: str) -> None:
    if out.returncode != 0:
        lines = [line for line in (out.stdout + out.stderr).splitlines() if "is ignored: it is neither" not in line]
        raise HarborUnavailable(f"{what} failed:\n" + "\n".join(lines[-30:]))


def build_venv(path: Path) -> Path:
    """The venv at ``path``, reused when it holds what is wanted and imports, else built again; its python."""
    python, ready = path / "bin" / "python", path / READY
    want = {"package": HARBOR, "runtime": RUNTIME}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists() and json.loads(ready.read_text()) == want and _run(str(python), "-c", PROBE).returncode == 0:
            return python
        shutil.rmtree(path, ignore_errors=True)
        _check(_run(sys.executable, "-m", "venv", str(path)), "python -m venv")
        pip = (str(python), "-m", "pip", "--disable-pip-version-check", "-q")
        wheels = path / "wheels"
        _check(_run(*pip, "download", "--no-deps", "--ignore-requires-python", HARBOR, "-d", str(wheels)),
               f"pip download {HARBOR}")
        [wheel] = wheels.glob("harbor-*.whl")
        _check(_run(*pip, "install", "--no-deps", "--ignore-requires-python", str(wheel)), f"pip install {wheel.name}")
        _check(_run(*pip, "install", *RUNTIME), "pip install " + " ".join(RUNTIME))
        _check(_run(str(python), "-c", PROBE), "importing Harbor's models")
        ready.write_text(json.dumps(want))
    return python


def harbor_python(pytestconfig: Any, tmp_path_factory: Any) -> Path:
    """The python of the Harbor venv (built or reused); skips the test without one, fails under
    ``ROLLOUT_REQUIRE_HARBOR=1``. Call it from a session fixture."""
    import pytest

    cache = getattr(pytestconfig, "cache", None)  # None with -p no:cacheprovider: built for this session only
    name = HARBOR.replace("==", "-")
    path = (cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)) / "venv"
    path = Path(os.environ.get("ROLLOUT_HARBOR_VENV") or path)
    try:
        return build_venv(path)
    except (HarborUnavailable, OSError, ValueError, subprocess.TimeoutExpired) as error:
        message = f"no Harbor venv: {error}"
        if os.environ.get("ROLLOUT_REQUIRE_HARBOR", "") not in ("", "0", "false", "no"):
            pytest.fail(message)
        pytest.skip(message + " (set ROLLOUT_REQUIRE_HARBOR=1 to make this an error)")


def run_in_harbor(python: Path, function: Callable[[Any], Any], request: Any) -> Any:
    """``function(request)`` run in the Harbor venv (its source is the child's program: it imports what it needs
    itself); its JSON answer."""
    code = (textwrap.dedent(inspect.getsource(function)) + "\nimport json, sys\n"
            f"print({MARK!r} + json.dumps({function.__name__}(json.loads(sys.stdin.read()))))\n")
    return _answer(_run(str(python), "-c", code, stdin=json.dumps(request), timeout=300))


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
    return _answer(out)


def _answer(out: subprocess.CompletedProcess) -> Any:
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise AssertionError(f"the Harbor child failed ({out.returncode}):\n{out.stderr[-4000:]}")


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
    answer = {"validate": _validate, "traces": _traces}[sys.argv[1]](json.loads(sys.stdin.read()))
    print(MARK + json.dumps(answer))
