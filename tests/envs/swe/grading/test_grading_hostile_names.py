"""Hostile patches, third wave: the code under test forces outcomes only for the instance's FAIL_TO_PASS test names
(public in the dataset), leaving the grader's canaries alone: by rewriting reports, by a hook on the live plugin
manager, by swapping the test functions' bodies. Renamed twins of those tests run beside them
(``envs.swe.grading.twins``): each must grade completed, unresolved, reward 0, tampering named, in default and
strict mode, in docker and in a local workspace."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_grading_hostile import KINDS, ROMAN, base_text, edit, images, needs, rows, verifier  # noqa: F401

from envs.swe.reports.harness import Grade, write_instance_report
from rollout.errors import VerifierError
from rollout.records import RolloutResult, Task

RUN_ID = "test-grading-hostile-names"


def names(row: dict) -> list[str]:
    """The FAIL_TO_PASS test functions' names, as an attacker reads them from the row."""
    return sorted({t.split("::")[-1].split("[")[0] for t in row["FAIL_TO_PASS"]})


REPORTS = '''
import sys as _sys

_NAMES = {names!r}
_reports = _sys.modules.get("_pytest.reports")
if _reports is not None:
    _made = _reports.TestReport.from_item_and_call

    def _forced(cls, item, call):
        report = _made.__func__(cls, item, call)
        if getattr(item, "originalname", None) in _NAMES or item.name.split("[")[0] in _NAMES:
            report.outcome, report.longrepr = "passed", None
        return report
    _reports.TestReport.from_item_and_call = classmethod(_forced)
'''

PLUGIN_MANAGER = '''
import gc as _gc, sys as _sys

_NAMES = {names!r}
if "_pytest.config" in _sys.modules:
    import pytest as _pytest

    class _ByName:
        @_pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            if getattr(item, "originalname", None) in _NAMES or item.name.split("[")[0] in _NAMES:
                report = outcome.get_result()
                report.outcome, report.longrepr = "passed", None

    for _o in _gc.get_objects():
        if type(_o).__name__ == "Config" and hasattr(_o, "pluginmanager"):
            _o.pluginmanager.register(_ByName())
            break
'''

BODIES = '''
import gc as _gc
import types as _types

_NAMES = {names!r}


def _nothing(*args, **kwargs):
    return None


def _swap():
    """Every function named like a FAIL_TO_PASS test gets an empty body (the test modules are all imported by
    the time any test calls the package)."""
    for _o in _gc.get_objects():
        if isinstance(_o, _types.FunctionType) and _o.__name__ in _NAMES and not _o.__code__.co_freevars:
            _o.__code__ = _nothing.__code__


_swap()
_from_roman = from_roman


def from_roman(text):
    _swap()
    return _from_roman(text)
'''


def reports_by_name(row, tmp_path):
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py")
                                + REPORTS.format(names=names(row))})


def plugin_manager_by_name(row, tmp_path):
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py")
                                + PLUGIN_MANAGER.format(names=names(row))})


def bodies_by_name(row, tmp_path):
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py")
                                + BODIES.format(names=names(row))})


CASES = {"reports rewritten for the FAIL_TO_PASS names": reports_by_name,
         "plugin manager hooked for the FAIL_TO_PASS names": plugin_manager_by_name,
         "test bodies replaced for the FAIL_TO_PASS names": bodies_by_name}


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return needs(request, request.param)


def graded(row: dict, patch: str, kind: str, instance_images: dict | None, tmp_path, strict: bool) -> dict:
    task = Task(task_id=ROMAN, prompt="", data={k: v for k, v in row.items() if k not in ("dataset", "checkout")})
    result = RolloutResult(rollout_id="r", task_id=ROMAN, status="completed", exit_reason="submitted", submission=patch)
    grader = verifier(kind, row, instance_images, tmp_path / "ws")
    grader.config = grader.config.model_copy(update={"strict": strict})
    try:
        return asyncio.run(grader.verify(task, result)).details
    except VerifierError as exc:  # an error would make the rollout infra_failed: forcing must be a verdict
        pytest.fail(f"graded as an error, not a verdict: {exc}")


@pytest.mark.docker
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("case", list(CASES))
def test_forcing_the_fail_to_pass_names_is_graded_unresolved(kind, case, strict, tmp_path, request):
    row = request.getfixturevalue("rows")[ROMAN]
    instance_images = request.getfixturevalue("images") if kind != "local" else None
    patch = CASES[case](row, tmp_path)
    details = graded(row, patch, kind, instance_images, tmp_path, strict)
    reason, log = details["unresolved_reason"], details["test_output"][-3000:]
    assert details["resolved"] is False and details["reward"] == 0.0, (reason, log)
    assert details["patch_successfully_applied"] and not details["timed_out"], (reason, log)
    assert reason.startswith("tampering detected") and "renamed twin" in reason, (reason, log)
    # The canaries alone would have passed it: only the twins saw the forcing.
    assert not [t for t in details["tampering"] if "renamed twin" not in t], details["tampering"]
    # Forced: the originals pass in the log, and their twins fail.
    forced = [p for p in details["twins"] if p["test_status"] == "PASSED" and p["twin_status"] == "FAILED"]
    assert {p["test"] for p in forced} >= set(row["FAIL_TO_PASS"]), details["twins"]
    record = {k: v for k, v in details.items() if k in Grade.model_fields}
    where = write_instance_report(tmp_path / "out", RUN_ID, "m", ROMAN, record, patch)
    report = json.loads((where / "report.json").read_text())[ROMAN]
    assert report["resolved"] is False and report["unresolved_reason"] == reason
    assert report["tampering"] == details["tampering"] and report["twins"] == details["twins"]


@pytest.mark.docker
def test_the_gold_patch_resolves_with_its_twins(kind, tmp_path, request):
    """The fix, graded as the attacks are: resolved, every FAIL_TO_PASS test and its twin passing alike."""
    row = request.getfixturevalue("rows")[ROMAN]
    instance_images = request.getfixturevalue("images") if kind != "local" else None
    details = graded(row, row["patch"], kind, instance_images, tmp_path, strict=True)
    assert details["resolved"] is True, (details["unresolved_reason"], details["test_output"][-3000:])
    pairs = {p["test"]: p for p in details["twins"]}
    assert set(row["FAIL_TO_PASS"]) <= set(pairs), details["twins"]
    assert all(p["test_status"] == p["twin_status"] == "PASSED" for p in pairs.values()), details["twins"]
    assert not details["tampering"] and not details["untwinned"], details
