"""SWE-bench 5.x rows: the row's own eval script, run with its test command's exit code recorded; its log judged,
its tests sorted into categories and an unresolved run's likely infrastructure cause named, by 5.x's rules."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from envs.swe.logs.parsers import Parser
from envs.swe.logs.pytest_log import END_MARKER, ERROR, FAILED, FAILING, PASSING, SKIPPED, START_MARKER

EXIT_CODE_LINE = ">>>>> Test Exit Code"
EXIT_CODE_VAR = "SWEBENCH_TEST_EXIT_CODE"
"""The harness's record of the test command's exit code, printed after the end marker, and the variable holding it."""
SCRIPT_HEAD = ("#!/bin/bash", "set -uxo pipefail")
"""Lines the harness drops from a row's script and puts back at its top."""
BAD_MARKERS = (">>>>> Patch Apply Failed", ">>>>> Reset Failed", ">>>>> Tests Errored", ">>>>> Tests Timed Out")
"""A log holding any of these is no test run: nothing in it is graded."""
EVAL_TYPES = ("pass_and_fail", "fail_only")
KEY_VAR = "__rollout_grade_key"
"""Where the eval script keeps the grading script's marker prefix: read from its stdin, in no file, argument or
environment, so only the script (never the tests) can print the line that carries the exit code."""

F2P, P2P, F2F, P2F = "FAIL_TO_PASS", "PASS_TO_PASS", "FAIL_TO_FAIL", "PASS_TO_FAIL"

_RAN = re.compile("|".join((
    r"Executed [1-9]\d* of \d+", r"TOTAL: [1-9]\d* (?:SUCCESS|FAILED)", r"[1-9]\d* passing", r"Tests:\s+[1-9]\d*",
    r"Test Suites:\s+(?:\d+ \w+, )*[1-9]\d* total", r"^# tests [1-9]\d*", r"[1-9]\d* specs?, \d+ failures?",
    r"': ok$")), re.M)
"""A test runner's own count of tests it ran (karma, mocha, jest, TAP, jasmine, openlayers' rendering cases): with
no parsed result, a log without one of these is a suite that never ran, not a clean pass."""

ENVIRONMENT, AMBIGUOUS = "environment", "ambiguous"
INFRA_SIGNS = tuple((reason, tier, re.compile(pattern, re.M)) for reason, tier, pattern in (
    ("browser_launch_failed", ENVIRONMENT, r"Failed to launch|Failed to connect to the bus"),
    ("display_unavailable", ENVIRONMENT, r"cannot open display|Missing X server|unable to open X display"),
    ("out_of_memory", ENVIRONMENT, r"Cannot allocate memory|OutOfMemoryError|^Killed$"),
    ("container_unavailable", ENVIRONMENT, r"Error response from daemon|Cannot connect to the Docker daemon"),
    ("network_unreachable", ENVIRONMENT, r"Could not resolve host|Temporary failure in name resolution"),
    ("missing_module", AMBIGUOUS, r"Cannot find module|MODULE_NOT_FOUND|ModuleNotFoundError"),
    ("no_tests_collected", AMBIGUOUS, r"no tests ran|collected 0 items"),
    ("tests_timed_out", AMBIGUOUS, r"Timeout error: \d+ seconds exceeded"),
))
"""(reason, tier, sign) in the order 5.x reports them: the first sign found in a log that grades nothing names the
likely cause; only the environment tier marks the report's ``infra_failure``."""


def script_lines(script: str) -> list[str]:
    return [line for line in script.strip().split("\n") if line not in SCRIPT_HEAD]


def script_problem(script: object) -> str | None:
    """Why ``script`` (a row's ``eval_script``) cannot be graded, or None: it must print the start marker, then the
    end marker, each from a line of its own (the harness records the exit code at the end marker's line)."""
    if not isinstance(script, str) or not script.strip():
        return "must be a non-empty string holding the eval script"
    lines = script_lines(script)
    start = next((n for n, line in enumerate(lines) if START_MARKER in line), None)
    end = next((n for n, line in enumerate(lines) if END_MARKER in line), None)
    if start is None or end is None:
        return f"has no line printing {START_MARKER!r} and one printing {END_MARKER!r} after it"
    if end < start:
        return f"prints {END_MARKER!r} before {START_MARKER!r}"
    return None


def eval_body(script: str, report_export: str = "") -> str:
    """The eval.sh of a 5.x row, as the harness runs it (``set -uxo pipefail``, then the row's lines, the test
    command's ``$?`` kept in ``SWEBENCH_TEST_EXIT_CODE`` before the end marker and echoed after it), with, before the
    end marker, a line that only this script can print (the prefix read from stdin first), untraced; and
    ``report_export`` (pytest's report option) before the start marker, untraced."""
    out = [f"IFS= read -r {KEY_VAR} || exit 2", "exec 0</dev/null", SCRIPT_HEAD[1]]
    started = ended = False
    for line in script_lines(script):
        if START_MARKER in line and not started and report_export:
            out.append(f"{{ {report_export.strip()}; }} 2>/dev/null")
        started = started or START_MARKER in line
        if END_MARKER in line and started and not ended:
            ended = True
            out += [f"{EXIT_CODE_VAR}=$?", "{ __rollout_x=${-//[^x]/}; set +x; } 2>/dev/null",
                    f"printf '\\n%s test-exit %s\\n' \"${KEY_VAR}\" \"${EXIT_CODE_VAR}\"",
                    '[ -z "$__rollout_x" ] || set -x', line, f'echo "{EXIT_CODE_LINE}: ${EXIT_CODE_VAR}"']
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def take_exit_code(log: str, prefix: str) -> tuple[str, int | None]:
    """(the log without the script's keyed exit-code line, that exit code or None when the line is missing)."""
    mark = f"\n{prefix} test-exit "
    at = log.find(mark)
    if at < 0:
        return log, None
    end = log.find("\n", at + len(mark))
    code = log[at + len(mark):end if end >= 0 else len(log)].strip()
    rest = log[end + 1:] if end >= 0 else ""
    return log[:at] + rest, int(code) if code.lstrip("-").isdigit() else None


def judge(log: str, parse: Parser, exit_code: int | None) -> tuple[dict[str, str], str]:
    """(statuses, why the log grades nothing; empty when it is graded), by 5.x's rules: no failure marker in it,
    both test output markers; the part between them parsed (else the whole log); no result needs the runner's own
    count of tests run; and a test command that exited non-zero must show a failing test."""
    bad = next((marker for marker in BAD_MARKERS if marker in log), None)
    if bad:
        return {}, f"the log holds {bad!r}"
    if START_MARKER not in log or END_MARKER not in log:
        return {}, "the log lacks the test output markers"
    statuses = parse(log.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0]) or parse(log)
    if not statuses and not _RAN.search(log):
        return {}, "no test result in the log, and no sign that the tests ran"
    if exit_code not in (None, 0) and statuses and not any(s in FAILING for s in statuses.values()):
        return {}, f"the test command exited with {exit_code} while the log shows no failing test"
    return statuses, ""


def _key(case: str, statuses: Mapping[str, str]) -> str | None:
    """The status key of an expected id: itself, or for an id cut inside its parameters (more ``[`` than ``]``),
    the first id it starts when all such ids agree on passing or not."""
    if case in statuses:
        return case
    if case.count("[") > case.count("]"):
        matches = [k for k in statuses if k.startswith(case)]
        if matches and len({statuses[k] in PASSING for k in matches}) == 1:
            return matches[0]
    return None


def categories(statuses: Mapping[str, str], expected: Mapping[str, Iterable[str]],
               fail_only: bool = False) -> dict[str, dict[str, list[str]]]:
    """Each FAIL_TO_PASS / PASS_TO_PASS id as success or failure by 5.x's rules: a skipped FAIL_TO_PASS test fails,
    a skipped PASS_TO_PASS test is kept; fail_only: only an id reported FAILED fails. The to-fail lists stay empty."""
    out: dict[str, dict[str, list[str]]] = {}
    for category in (F2P, P2P):
        success: list[str] = []
        failure: list[str] = []
        for case in expected.get(category) or ():
            if fail_only:
                (failure if statuses.get(case) == FAILED else success).append(case)
                continue
            key = _key(case, statuses)
            status = None if key is None else statuses[key]
            if status in PASSING or (category == P2P and status == SKIPPED):
                success.append(case)
            elif status is None or status in (FAILED, ERROR, SKIPPED):
                failure.append(case)
        out[category] = {"success": success, "failure": failure}
    return {**out, F2F: {"success": [], "failure": []}, P2F: {"success": [], "failure": []}}


def classify(log: str) -> tuple[str, str] | None:
    """(reason, tier) of the first infrastructure sign in ``log``, or None."""
    return next(((reason, tier) for reason, tier, sign in INFRA_SIGNS if sign.search(log)), None)


def report_export(report_path: str) -> str:
    """The line that makes pytest write its junitxml report to ``report_path`` (kept with options already set)."""
    option = shlex.quote(f"--junitxml={report_path}")
    return f'export PYTEST_ADDOPTS={option}"${{PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}}"'
