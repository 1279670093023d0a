"""SWE-smith and SWE-Gym rows: their test commands, log parsers and checkouts, as their own harnesses run them."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from envs.swe.diffs import diff_paths
from envs.swe.logs.parsers import OTHERS
from envs.swe.rows.shapes import SWEGYM, SWESMITH, EvalPlan
from rollout.errors import VerifierError

CONDA_ACTIVATE = "/opt/miniconda3/bin/activate"
ENV_NAME = "testbed"
"""Where the benchmarks' images keep the instance's environment."""
CONDA_SETUP = f"if [ -f {CONDA_ACTIVATE} ]; then source {CONDA_ACTIVATE} && conda activate {ENV_NAME}; fi"

SMITH_TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"
"""SWE-smith's Python profiles: the whole suite, verbose (its parser reads ``id STATUS`` lines)."""

GYM_TEST_CMDS = {
    "getmoto/moto": "pytest -n0 -rA", "conan-io/conan": "pytest -n0 -rA", "dask/dask": "pytest -n0 -rA  --color=no",
    "project-monai/monai": "pytest -rA ", "iterative/dvc": "pytest -rA", "bokeh/bokeh": "pytest -rA -n0",
    "modin-project/modin": "pytest -n0 -rA", "pandas-dev/pandas": "pytest -rA --tb=long",
    "facebookresearch/hydra": "pytest -rA --tb=long",
    "pydantic/pydantic": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header",
}
"""SWE-Gym's test command per repository (then the test patch's files); python/mypy selects cases by ``-k``."""
GYM_EVAL_COMMANDS = {"conan-io/conan": "export PYTHONPATH=${PYTHONPATH:-}:$(pwd)"}
NON_TEST_SUFFIXES = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
"""Files of a test patch that are no test to name on the command line."""


def smith_plan(data: Mapping[str, Any], ident: str) -> EvalPlan:
    """SWE-smith's evaluation: the instance branch checked out, then its parent (the bug, with the tests the branch
    removed); the row's ``test_cmd`` or the profile's whole-suite command, read by its verbose parser; the F2P and
    P2P test files reset to that commit after the patch."""
    command = _command(data.get("test_cmd")) or SMITH_TEST_CMD
    return EvalPlan(CONDA_SETUP, command, OTHERS["swesmith_pytest"], harness=SWESMITH, checkout=(ident, "HEAD~1"),
                    base="HEAD")


def gym_plan(data: Mapping[str, Any], ident: str) -> EvalPlan:
    """SWE-Gym's evaluation (its fork of the SWE-bench harness): the row's ``test_cmd``, or its repository's command
    with the test patch's test files (python/mypy: ``-k`` with the patch's ``[case ...]`` names); read by the
    harness's pytest parser (pydantic: its own). Installs are left out: the image has them."""
    repo = str(data.get("repo") or "").lower()
    parse = OTHERS["pydantic_pytest" if repo == "pydantic/pydantic" else "swebench4_pytest"]
    command = _command(data.get("test_cmd"))
    if command:
        return EvalPlan(CONDA_SETUP, command, parse, harness=SWEGYM)
    test_patch = str(data.get("test_patch") or "")
    if repo == "python/mypy":
        cases = re.findall(r"\[case ([^\]]+)\]", test_patch)
        if not cases:
            raise VerifierError(f"instance {ident}: a python/mypy row selects its tests by the test patch's "
                                "[case ...] names, and it has none", retryable=False)
        flags = "-rA" if _version(data.get("version")) >= (1, 7) else "-n0 -rA"
        command = f"pytest {flags} -k {shlex.quote(' or '.join(cases))}"
    elif repo in GYM_TEST_CMDS:
        files = [p for p in dict.fromkeys(diff_paths(test_patch)) if not p.endswith(NON_TEST_SUFFIXES)]
        command = " ".join([GYM_TEST_CMDS[repo], *(shlex.quote(p) for p in files)])
    else:
        raise VerifierError(f"instance {ident}: no SWE-Gym test command for {repo!r}: give the row a test_cmd",
                            retryable=False)
    setup = "\n".join(filter(None, [CONDA_SETUP, GYM_EVAL_COMMANDS.get(repo)]))
    return EvalPlan(setup, command, parse, harness=SWEGYM)


def _command(test_cmd: object) -> str:
    if isinstance(test_cmd, list):
        return "\n".join(str(c) for c in test_cmd)
    return str(test_cmd or "")


def _version(text: object) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        return (0,)
