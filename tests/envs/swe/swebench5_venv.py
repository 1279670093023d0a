"""A separate virtualenv holding swebench 5.0.2, so our 5.x grading can be compared with the 5.x harness's own
``get_eval_report`` on the same log, while the project keeps its swebench 4.1 pin.

Only the grading modules are needed, and they import nothing outside the standard library but ``unidiff``; the
package ``swebench.harness``'s own ``__init__`` imports docker, datasets and modal, which grading never uses. So the
venv gets ``swebench --no-deps`` and ``unidiff``, and the child loads the grading modules without that ``__init__``.

Built once per machine in ``~/.cache/rollout-farm/venv-swebench5`` (or ``$ROLLOUT_SWEBENCH5_VENV``; outside the
work tree) under a file lock, reused
while it still imports. Run as a script inside that venv, this file is the child: a JSON file of cases in, one
JSON list of reports out. It imports only the standard library at the top level, for that reason."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

SWEBENCH = "swebench==5.0.2"
RUNTIME = ["unidiff==1.0.1"]
READY = "rollout-farm-ready.json"


class SwebenchUnavailable(RuntimeError):
    """The venv could not be built (no network, no index, a package that will not install)."""


def default_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("ROLLOUT_SWEBENCH5_VENV") or cache / "rollout-farm" / "venv-swebench5")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Swebench5Venv:
    """The swebench 5.x venv at ``path``: ``ensure()`` builds or reuses it; ``reports()`` asks its harness."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path or default_path())
        self.python = self.path / "bin" / "python"
        self.build_seconds: float | None = None

    def _run(self, *args: str, timeout: float = 600, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=stdin)

    def imports(self) -> bool:
        if not (self.path / READY).exists() or not self.python.exists():
            return False
        return self._run(str(self.python), __file__, "--probe", timeout=120).returncode == 0

    def ensure(self) -> "Swebench5Venv":
        with _locked(self.path):
            if not self.imports():
                self._build()
            self.build_seconds = json.loads((self.path / READY).read_text()).get("build_seconds")
        return self

    def _build(self) -> None:
        import shutil

        started = time.monotonic()
        shutil.rmtree(self.path, ignore_errors=True)
        made = self._run(sys.executable, "-m", "venv", str(self.path))
        if made.returncode != 0:
            raise SwebenchUnavailable(f"python -m venv failed: {made.stderr[-2000:]}")
        for args in (["--no-deps", SWEBENCH], RUNTIME):
            out = self._run(str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args)
            if out.returncode != 0:
                lines = [line for line in (out.stdout + out.stderr).splitlines() if "is ignored" not in line]
                raise SwebenchUnavailable(f"pip install {' '.join(args)} failed:\n" + "\n".join(lines[-30:]))
        probe = self._run(str(self.python), __file__, "--probe", timeout=120)
        if probe.returncode != 0:
            raise SwebenchUnavailable(f"swebench's grading does not import in the new venv:\n{probe.stderr[-3000:]}")
        self.build_seconds = round(time.monotonic() - started, 1)
        (self.path / READY).write_text(json.dumps({"build_seconds": self.build_seconds, "swebench": SWEBENCH}))

    def reports(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The harness's ``get_eval_report(..., include_tests_status=True)`` for each case: ``{"spec": {instance_id,
        FAIL_TO_PASS, PASS_TO_PASS, log_parser, eval_type}, "prediction": {...}, "log": text}``."""
        with tempfile.TemporaryDirectory(prefix="swebench5-") as where:
            for number, case in enumerate(cases):
                Path(where, f"{number}.log").write_text(case["log"])
            request = [{"spec": c["spec"], "prediction": c["prediction"], "log_path": str(Path(where, f"{n}.log"))}
                       for n, c in enumerate(cases)]
            out = self._run(str(self.python), __file__, timeout=300, stdin=json.dumps(request))
        if out.returncode != 0:
            raise RuntimeError(f"the swebench 5.x child failed:\n{out.stderr[-4000:]}")
        return json.loads(out.stdout)


# ---- the child, run by the venv's python ---------------------------------------------------------------------------

def _grading() -> Any:
    """swebench's grading modules, loaded without ``swebench.harness.__init__`` (docker, datasets, modal)."""
    import importlib.util
    import types

    root = os.path.dirname(importlib.util.find_spec("swebench").origin)  # type: ignore[union-attr]
    package = types.ModuleType("swebench.harness")
    package.__path__ = [os.path.join(root, "harness")]  # type: ignore[attr-defined]
    sys.modules["swebench.harness"] = package
    from swebench.harness import grading
    from swebench.types import TestSpec

    return grading, TestSpec


def _serve() -> None:
    grading, test_spec = _grading()
    answers = []
    for case in json.loads(sys.stdin.read()):
        spec = test_spec(image="", eval_script_list=[], repo="", version="", **case["spec"])
        answers.append(grading.get_eval_report(spec, case["prediction"], case["log_path"], include_tests_status=True))
    print(json.dumps(answers))


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        _grading()
    else:
        _serve()
