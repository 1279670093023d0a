"""How an instance's tests run and are read, by its row's shape: a 5.x row's own eval script and parser; SWE-smith's
and SWE-Gym's commands; else its own ``test_cmd`` with the pytest parser, or the SWE-bench harness's per-repository
command and parser (optional ``swebench`` package)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from envs.swe.logs.parsers import PARSERS, PYTEST_FAMILY
from envs.swe.logs.pytest_log import END_MARKER, START_MARKER, parse_test_statuses
from envs.swe.logs.pytest_report import wants_report
from envs.swe.rows.shapes import SWEBENCH5, SWEGYM, SWESMITH, V5_LADDER, EvalPlan, shape_of
from envs.swe.rows.smith_gym import CONDA_ACTIVATE, ENV_NAME, gym_plan, smith_plan
from envs.swe.rows.v5 import script_lines
from rollout.errors import VerifierError

__all__ = ["EvalPlan", "eval_plan", "swebench_plan", "v5_plan"]


def eval_plan(task_data: Mapping[str, Any], ident: str) -> EvalPlan:
    """By the row's shape: 5.x, SWE-smith, SWE-Gym (``envs.swe.rows.smith_gym``); else the row's ``test_cmd`` (a
    string, or a list of commands run in turn) read with ``parse_test_statuses``; without one, the harness's own
    spec for the row's repo and version."""
    shape = shape_of(task_data)
    if shape == SWEBENCH5:
        return v5_plan(task_data, ident)
    if shape == SWESMITH:
        return smith_plan(task_data, ident)
    if shape == SWEGYM:
        return gym_plan(task_data, ident)
    test_cmd = task_data.get("test_cmd")
    if isinstance(test_cmd, list):
        test_cmd = "\n".join(str(c) for c in test_cmd)
    if test_cmd:
        return EvalPlan("", str(test_cmd), parse_test_statuses)
    return EvalPlan(*swebench_plan(task_data, ident))


def v5_plan(task_data: Mapping[str, Any], ident: str) -> EvalPlan:
    """A 5.x row: its ``eval_script`` run (it applies the test patch itself), read by its ``log_parser``, graded by
    its ``eval_type``; pytest's report confirms the log when the parser reads pytest ids and the script runs pytest.
    ``command`` (for the records): the script's lines between the test output markers."""
    script, name = str(task_data.get("eval_script") or ""), str(task_data.get("log_parser") or "")
    if name not in PARSERS:
        raise VerifierError(f"instance {ident}: log_parser {name!r} is not one we read", retryable=False)
    lines = script_lines(script)
    start = next((n for n, line in enumerate(lines) if START_MARKER in line), 0)
    end = next((n for n, line in enumerate(lines) if END_MARKER in line and n > start), len(lines))
    command = "\n".join(lines[start + 1:end])
    return EvalPlan("", command, PARSERS[name], fail_only=task_data.get("eval_type") == "fail_only",
                    harness=SWEBENCH5, ladder=V5_LADDER, eval_script=script,
                    report=name in PYTEST_FAMILY and wants_report(command))


def swebench_plan(task_data: Mapping[str, Any], ident: str) -> tuple[str, str, Callable[[str], dict[str, str]], bool]:
    """(setup lines, test command, log parser, fail-only rule) as the harness builds its eval script: the
    environment activated, the spec's ``eval_commands`` and ``install``, then ``test_cmd`` followed by the
    test files of ``test_patch``; parsed by the repository's own parser."""
    try:
        from swebench.harness.constants import FAIL_ONLY_REPOS, MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
        from swebench.harness.test_spec.python import get_test_directives
    except Exception as exc:  # noqa: BLE001 - missing, or installed without its dependencies
        raise VerifierError(
            f"instance {ident} has no test_cmd; install swebench 4.1.x for the official per-repo specs "
            f"(importing it failed: {type(exc).__name__}: {exc})", retryable=False) from None
    repo, version = str(task_data.get("repo") or ""), str(task_data.get("version") or "")
    specs = MAP_REPO_VERSION_TO_SPECS.get(repo, {}).get(version)
    parser = MAP_REPO_TO_PARSER.get(repo)
    if specs is None or parser is None or "test_cmd" not in specs:
        raise VerifierError(f"instance {ident} has no test_cmd, and swebench has no spec for repo {repo!r} "
                            f"version {version!r}", retryable=False)
    if MAP_REPO_TO_EXT.get(repo) != "py":
        # The harness builds other languages' eval scripts differently; only its Python one is mirrored here.
        raise VerifierError(f"instance {ident} has no test_cmd, and only Python repositories can use the "
                            f"swebench specs ({repo} is not one): give the row a test_cmd", retryable=False)
    commands = specs["test_cmd"] if isinstance(specs["test_cmd"], list) else [specs["test_cmd"]]
    instance = dict(task_data)
    setup = [f"if [ -f {CONDA_ACTIVATE} ]; then source {CONDA_ACTIVATE} && conda activate {ENV_NAME}; fi",
             *specs.get("eval_commands", [])]
    if specs.get("install"):
        setup.append(specs["install"])
    setup += commands[:-1]
    command = " ".join([commands[-1], *get_test_directives(instance)])
    spec = _test_spec(instance)
    return "\n".join(setup), command, (lambda log: parser(log, spec)), repo in FAIL_ONLY_REPOS


def _test_spec(instance: dict[str, Any]) -> Any:
    """The harness's TestSpec when the instance has every field it needs (some parsers read it), else None."""
    try:
        from swebench.harness.test_spec.test_spec import make_test_spec

        return make_test_spec(instance)
    except Exception:  # noqa: BLE001 - the Python parsers do not use it
        return None
