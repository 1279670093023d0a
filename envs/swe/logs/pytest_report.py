"""pytest's junitxml report read back, and the log's passing statuses checked against it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping

from envs.swe.logs.pytest_log import FAILED, PASSED, XFAIL

REPORT_PASSED, REPORT_XFAIL = "passed", "xfail"


def wants_report(command: str) -> bool:
    """Whether the test command runs pytest itself, so its results must be confirmed by a report. Under tox
    the environment (and so the report option) may not reach pytest: such commands are read from the log only."""
    return re.search(r"\bpy\.?test\b", command) is not None and "tox" not in command


def read_junit(data: bytes) -> list[tuple[str, str, str]] | None:
    """(classname, name, outcome) of every testcase in a junitxml report (outcome: passed, failed, error,
    skipped or xfail); None when there is no readable report."""
    if not data.strip():
        return None
    try:
        root = ET.fromstring(data)
    except (ET.ParseError, ValueError):
        return None
    cases = []
    for case in root.iter("testcase"):
        outcome = REPORT_PASSED
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = child.tag
                break
            if child.tag == "skipped":
                outcome = REPORT_XFAIL if child.get("type") == "pytest.xfail" else "skipped"
        cases.append((case.get("classname") or "", case.get("name") or "", outcome))
    return cases


def junit_address(test_id: str) -> tuple[str, str]:
    """(classname, name) pytest's junitxml gives the node id ``test_id`` (its ``mangle_test_address``)."""
    path, bracket, params = test_id.partition("[")
    names = [n for n in path.split("::") if n != "()"]
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def unconfirmed(statuses: Mapping[str, str], cases: list[tuple[str, str, str]] | None,
                tests: Iterable[str]) -> list[str]:
    """The ``tests`` the log shows passing (PASSED or XFAIL) that no testcase of the report shows the same
    way. A testcase matches an id by name (whole, or cut at its first space as the harness cuts ids) and
    by classname (equal, or a dotted suffix: the report's is relative to pytest's rootdir)."""
    want = {PASSED: REPORT_PASSED, XFAIL: REPORT_XFAIL}
    index: dict[str, list[tuple[str, str]]] = {}
    for classname, name, outcome in cases or ():
        index.setdefault(name, []).append((classname, outcome))
        cut = name.split()[0] if name.split() else name
        if cut != name:
            index.setdefault(cut, []).append((classname, outcome))
    found = []
    for test in tests:
        status = statuses.get(test)
        if status not in want:
            continue
        classname, name = junit_address(test)
        if not any(outcome == want[status] and (theirs == classname or classname.endswith("." + theirs))
                   for theirs, outcome in index.get(name, ())):
            found.append(test)
    return found


def demote(statuses: Mapping[str, str], tests: Iterable[str]) -> dict[str, str]:
    """``statuses`` with each of ``tests`` FAILED."""
    return {**statuses, **{t: FAILED for t in tests}}
