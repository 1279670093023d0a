"""SWE-bench grading in a fresh runtime: model patch (lenient ladder), tests restored, test patch, tests, report."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from envs.swe.diffs import diff_paths
from envs.swe.grading import canaries as canary_tests, twins as twin_tests
from envs.swe.grading.eval_script import EvalScript, with_newline
from envs.swe.grading.patch import refusal
from envs.swe.grading.protect import test_file_paths, test_like, to_reset, with_sections
from envs.swe.grading.pytest_launch import grading_mode
from envs.swe.grading.script_run import (
    ScriptRun,
    applied,
    log_only,
    near,
    printed_step,
    remove_scratch,
    run_script,
    tests_prepared,
)
from envs.swe.logs.pytest_log import FAILING, eval_section
from envs.swe.logs.pytest_report import demote, read_junit, unconfirmed, wants_report
from envs.swe.reports.harness import CATEGORIES, FAIL_TO_PASS, PASS_TO_PASS, Grade, is_resolved, status_by_category
from envs.swe.rows.shapes import APPLY_LADDER, SWEBENCH5, EvalPlan, shape_of, tests_of
from envs.swe.rows.specs import eval_plan
from envs.swe.rows.v5 import ENVIRONMENT, categories, classify, judge, take_exit_code
from rollout.errors import VerifierError
from rollout.protocols import Runtime

__all__ = ["APPLY_LADDER", "Grade", "grade"]

_GIT = "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false"
"""Every git command of the grader: a repository owned by another user (an image's /testbed) is still ours, and no
hook or monitor program runs (the patch cannot write .git, and the image's own hooks are no business of grading)."""
TAMPERING = "tampering detected"


async def grade(task_data: Mapping[str, Any], model_patch: str | None, runtime_factory: Callable[[], Runtime], *,
                eval_timeout: float = 1800, repo_dir: str = "/testbed", log: Callable[[str], Any] | None = None,
                setup_timeout: float = 600, max_log_chars: int = 200_000, strict: bool = False,
                canaries: bool = True) -> Grade:
    """Grade ``model_patch`` for one SWE-bench instance in a new runtime from ``runtime_factory()``
    (started here, always closed), whose repository at ``base_commit`` is in ``repo_dir`` (absolute, or
    relative to the runtime's workdir). Bad instance data or a test patch that does not apply raise
    ``VerifierError``; whatever the patch does (not apply, fail or crash the tests, tamper with them) is an
    unresolved Grade with its ``unresolved_reason``.

    The work in the runtime is writing an ``envs.swe.grading.eval_script`` script (patches inside) and one ``exec``
    of it: the apply ladder; then, reset to ``base_commit``, every file the tests rely on that the patch
    touched (the test patch's files, the files of FAIL_TO_PASS / PASS_TO_PASS ids, conftest.py, pytest.ini)
    and the pytest section of tox.ini / setup.cfg / pyproject.toml; the test patch; the tests
    (``setup_timeout`` per preparation step, ``eval_timeout`` for the tests, by ``timeout`` in the runtime;
    the exec's own limit is a backstop), pytest's junitxml report and the log printed last. A test counts as
    passing only when the log and the report agree, and a test command that exits other than 0 or 1
    (interrupted, crashed, killed) resolves nothing. ``strict``: a patch touching test files or pytest
    configuration scores 0 without running. Report and log files are read back only when the output was cut
    short; scratch files are removed afterwards only where they outlive the runtime (a local workspace).
    ``durations``: start, apply, reset, tests (by the script's clock), overhead (the rest of the exec:
    the call, the shells, printing the log), read and cleanup (if any), close, total.

    Each row shape is graded as its own harness does (``envs.swe.rows.shapes``): a 5.x row runs its own eval script
    (the test patch applied by it), its log judged and its tests sorted by 5.x's rules; a SWE-smith row is first
    checked out at its instance branch's parent; the apply ladder is the shape's harness's."""
    say = log or (lambda _msg: None)
    ident = str(task_data.get("instance_id") or task_data.get("task_id") or "")
    expected = {c: tests_of(task_data, c, ident) for c in CATEGORIES}
    if "FAIL_TO_PASS" not in task_data:
        raise VerifierError(f"instance {ident} has no FAIL_TO_PASS tests", retryable=False)
    result = Grade(instance_id=ident, patch_is_None=model_patch is None,
                   patch_exists=bool(model_patch and model_patch.strip()))
    if not result.patch_exists:  # the row's harness: 5.x's report says infra_failure (false) for no patch too
        result.unresolved_reason, result.harness = "no patch", shape_of(task_data)
        say(f"{ident}: no patch, unresolved")
        return result
    plan = eval_plan(task_data, ident)
    result.test_cmd, result.harness = plan.command, plan.harness
    test_patch = str(task_data.get("test_patch") or "")
    tested = expected[FAIL_TO_PASS] + expected[PASS_TO_PASS]
    id_files = test_file_paths(tested)
    protected = [*diff_paths(test_patch), *id_files]
    touched = diff_paths(with_newline(model_patch))
    if refused_why := refusal(with_newline(model_patch), protected):
        result.unresolved_reason = f"refused: {refused_why}"
        say(f"{ident}: {result.unresolved_reason}")
        return result
    if strict and (refused := test_like(touched, protected)):
        result.unresolved_reason = f"strict grading: the patch touches tests or their configuration: {_few(refused)}"
        say(f"{ident}: {result.unresolved_reason}")
        return result
    reset, sections = to_reset(touched, protected), with_sections(touched)
    base = plan.base or str(task_data.get("base_commit") or "HEAD")
    report = wants_report(plan.command) if plan.report is None else plan.report
    # A 5.x row's own script checks its test patch's files out and patches them after our steps: canaries and
    # twins go only where it leaves them.
    skip = diff_paths(test_patch) if plan.eval_script else ()
    own_tests = report and canaries
    twinned = twin_tests.plan(plan.command, expected[FAIL_TO_PASS], expected[PASS_TO_PASS], skip) if own_tests else []
    planted = canary_tests.plan(plan.command, tested, skip=skip, prefer=expected[FAIL_TO_PASS], taken=[
        t.name for t in twinned], must_pass=not any(t.passes for t in twinned)) if own_tests else []
    script = EvalScript(secrets.token_hex(6), model_patch, "" if plan.eval_script else test_patch, base, plan.setup,
                        plan.command, plan.ladder, _GIT, setup_timeout, eval_timeout, reset_paths=reset,
                        section_paths=sections, report=report, eval_script=plan.eval_script, checkout=plan.checkout,
                        canaries=planted, twins=twinned, test_files=id_files)
    began = time.monotonic()
    mark = _clock(result, began)
    runtime = runtime_factory()
    try:
        await runtime.start()
        mark("start")
        run = ScriptRun(script, await run_script(runtime, script, repo_dir, mark), ident)
        result.durations.update({k: round(v, 3) for k, v in run.phases(mark("exec", keep=False)).items()})
        result.apply_method, result.apply_output, why_not = applied(run)
        if result.apply_method is None:
            result.unresolved_reason = why_not
            say(f"{ident}: {why_not}, unresolved")
            return result
        result.patch_successfully_applied = True
        say(f"{ident}: patch applied with `{result.apply_method}`")
        restored = tests_prepared(run, bool(reset or sections) or near(touched, [*protected, *reset]))
        if isinstance(restored, str):
            result.unresolved_reason = restored
            return result
        result.restored = [*reset, *restored]
        if strict and restored:
            result.unresolved_reason = f"strict grading: the patch changes pytest configuration in {_few(restored)}"
            return result
        tests = run.steps.get("tests")
        if tests is None or (tests.returncode is None and not run.ran.timed_out):
            raise run.stopped("before the tests" if tests is None else "while the tests ran")
        # Still running when the exec's backstop fired, or stopped by the in-container timeout.
        result.timed_out = tests.returncode is None or tests.stopped(eval_timeout)
        result.eval_script_returncode = None if result.timed_out else tests.returncode
        text = await printed_step(runtime, run, "log", script.log_path, mark)
        if result.timed_out:
            text += f"\n\nTimeout error: {eval_timeout:g} seconds exceeded.\n"
        text, statuses, why = _read_log(result, plan, script, text)
        unconfirmed_tests: list[str] = []
        cases, logged = None, statuses
        if script.report and not result.timed_out:
            cases = read_junit((await printed_step(runtime, run, "report", script.report_path, mark)).encode())
            result.report_found = cases is not None
            # An id whose file is in no tree these tests ran in names a test of an inner run (pytest's own tests
            # print their pytester runs' lines): the report cannot confirm it; the log is read as the harness reads it.
            result.log_only = log_only(run, tested, id_files, diff_paths(test_patch) if plan.eval_script else ())
            unconfirmed_tests = unconfirmed(statuses, cases, [t for t in tested if t not in result.log_only])
            statuses = demote(statuses, unconfirmed_tests)
        mode = run.steps.get("mode")
        result.grading_mode, result.grading_modules = grading_mode(mode.output if mode else "")
        placed = canary_tests.placed(run.steps["canaries"].output, planted)
        result.canaries = len(placed)
        made = run.steps["twins"].output if "twins" in run.steps else ""
        result.untwinned = twin_tests.skipped(made, twinned)
        if not result.timed_out:
            # A log line the report does not confirm is discounted already (its own reason): twins weigh the rest.
            counted = {t: s for t, s in logged.items() if t not in unconfirmed_tests}
            result.twins, mismatched = twin_tests.evidence(twin_tests.placed(made, twinned), counted, cases)
            result.tampering = canary_tests.evidence(placed, logged, cases) + mismatched
        own = {c.node_id for c in placed}
        if (result.test_returncode == 1 and placed and not result.tampering
                and not any(s in FAILING for t, s in logged.items() if t not in own)):
            result.test_returncode = 0  # the only failures are the must-fail canaries: pytest's code without them
            if plan.harness != SWEBENCH5:  # there the script's own code is the test command's
                result.eval_script_returncode = 0
        result.test_statuses = statuses
        result.test_output = text if len(text) <= max_log_chars else "[... cut ...]\n" + text[-max_log_chars:]
        sort = categories if plan.harness == SWEBENCH5 else status_by_category
        result.tests_status = {} if why else sort(result.test_statuses, expected, fail_only=plan.fail_only)
        exit_ok = result.test_returncode in (0, 1)
        result.resolved = (not (result.timed_out or why or result.tampering) and exit_ok
                           and is_resolved(result.tests_status))
        result.reward = 1.0 if result.resolved else 0.0
        if not result.resolved:
            result.unresolved_reason = _reason(result, unconfirmed_tests, eval_timeout, why)
        say(f"{ident}: {'resolved' if result.resolved else result.unresolved_reason}")
        return result
    finally:
        try:
            if os.path.exists(script.scratch):  # on this host: nothing else removes it
                await remove_scratch(runtime, script)
                mark("cleanup")
        finally:
            await runtime.close()
            mark("close")
            result.durations["total"] = round(time.monotonic() - began, 3)


def _read_log(result: Grade, plan: EvalPlan, script: EvalScript, text: str) -> tuple[str, dict[str, str], str]:
    """(the log as the row's harness has it, its statuses, why a 5.x log grades nothing or ""); the test command's
    exit code recorded (a 5.x row's: from the line only its eval script can print, taken out of the log)."""
    if plan.harness != SWEBENCH5:
        result.test_returncode = result.eval_script_returncode
        return text, plan.parse(eval_section(text)) or plan.parse(text), ""  # the harness's fallback: the whole log
    text, code = take_exit_code(text, script.prefix)
    result.test_returncode = None if result.timed_out else code
    statuses, why = judge(text, plan.parse, code)
    result.log_valid = not why
    found = classify(text) if why else None
    if found is not None:
        result.infra_failure_reason, result.infra_failure = found[0], found[1] == ENVIRONMENT
    return text, statuses, why


def _reason(result: Grade, unconfirmed_tests: list[str], eval_timeout: float, why: str = "") -> str:
    """Why a graded patch is unresolved, the grader's own findings first."""
    restored = f" (the patch changed {_few(result.restored)}: restored to base_commit)" if result.restored else ""
    if result.timed_out:
        return f"the tests ran past the {eval_timeout:g}s limit{restored}"
    if why:
        return f"the log grades nothing by the 5.x harness's rules: {why}{restored}"
    if result.test_returncode not in (0, 1):
        return (f"the test command exited with {result.test_returncode} (not 0 or 1: the run was interrupted, "
                f"crashed or killed){restored}")
    if result.tampering:
        return f"{TAMPERING}: {'; '.join(result.tampering[:3])}{restored}"
    if unconfirmed_tests and not result.report_found:
        return f"pytest wrote no report of its results, so the log's passing tests do not count{restored}"
    if unconfirmed_tests:
        return f"the log says passed but pytest's report does not, for {_few(unconfirmed_tests)}{restored}"
    failing = [f"{c} {_few(result.tests_status[c]['failure'])}" for c in (FAIL_TO_PASS, PASS_TO_PASS)
               if result.tests_status[c]["failure"]]
    return f"tests failed: {'; '.join(failing)}{restored}"


def _few(items: list[str], shown: int = 5) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _clock(result: Grade, began: float) -> Callable[..., float]:
    last = [began]

    def mark(phase: str, keep: bool = True) -> float:
        """Seconds since the previous mark, recorded under ``phase`` unless ``keep`` is false."""
        now = time.monotonic()
        seconds, last[0] = now - last[0], now
        if keep:
            result.durations[phase] = round(seconds, 3)
        return seconds

    return mark
