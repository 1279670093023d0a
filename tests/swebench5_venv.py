"""swebench 5.0.2's own grading reads the logs we grade, from a venv of its own (``foreign_venvs.SWEBENCH5``; the
session fixture ``swebench5`` gives a ``Swebench5`` on it), so that our 5.x grading can be compared with the 5.x
harness's ``get_eval_report`` on the same log while the project keeps its swebench 4.1 pin.

Only the grading modules are needed, and they import nothing outside the standard library but ``unidiff``; the
package ``swebench.harness``'s own ``__init__`` imports docker, datasets and modal, which grading never uses, so the
child loads the grading modules without that ``__init__``. Run as a script inside that venv, this file is the
child (``--probe``: only load them): a JSON list of cases in, one JSON list of reports out. It imports only the
standard library at the top level, for that reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


class Swebench5:
    """The harness of the swebench 5.x venv whose python is ``python``."""

    def __init__(self, python: Path):
        self.python = python

    def reports(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The harness's ``get_eval_report(..., include_tests_status=True)`` for each case: ``{"spec": {instance_id,
        FAIL_TO_PASS, PASS_TO_PASS, log_parser, eval_type}, "prediction": {...}, "log": text}``."""
        with tempfile.TemporaryDirectory(prefix="swebench5-") as where:
            for number, case in enumerate(cases):
                Path(where, f"{number}.log").write_text(case["log"])
            request = [{"spec": c["spec"], "prediction": c["prediction"], "log_path": str(Path(where, f"{n}.log"))}
                       for n, c in enumerate(cases)]
            out = subprocess.run([str(self.python), __file__], input=json.dumps(request), capture_output=True,
                                 text=True, timeout=300)
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
