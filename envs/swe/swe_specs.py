"""How an instance's tests run and are read: its own ``test_cmd`` with the pytest parser, or else the SWE-bench
harness's per-repository command and parser (optional ``swebench`` package)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from envs.swe.pytest_log import parse_test_statuses
from rollout.errors import VerifierError

CONDA_ACTIVATE = "/opt/miniconda3/bin/activate"
ENV_NAME = "testbed"
"""Where the harness's images keep the instance's environment."""


@dataclass
class EvalPlan:
    """Shell lines to run first, the test command, the log parser, and whether only FAILED fails."""

    setup: str
    command: str
    parse: Callable[[str], dict[str, str]]
    fail_only: bool = False


def eval_plan(task_data: Mapping[str, Any], ident: str) -> EvalPlan:
    """The row's ``test_cmd`` (a string, or a list of commands run in turn) read with ``parse_test_statuses``;
    without one, the harness's own spec for the row's repo and version."""
    test_cmd = task_data.get("test_cmd")
    if isinstance(test_cmd, list):
        test_cmd = "\n".join(str(c) for c in test_cmd)
    if test_cmd:
        return EvalPlan("", str(test_cmd), parse_test_statuses)
    return EvalPlan(*swebench_plan(task_data, ident))


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
