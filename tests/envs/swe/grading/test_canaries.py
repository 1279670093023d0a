"""Canaries: where the grader puts its own tests, that they look like the instance's, that they never flag an
honest patch (every bundled gold patch, five gradings each), and what they show against a forced run."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from envs.runtimes.local import LocalRuntime
from envs.runtimes.prepared import PreparedRepoRuntime
from envs.swe.evaluate import LOCAL_ENV
from envs.swe.grading.canaries import Canary, evidence, plan
from envs.swe.grading.grade import grade
from envs.swe.mini import build

IDS = ["tests/test_roman.py::test_from_roman_rejects[IIII]", "tests/test_roman.py::TestSpelling::test_pairs_read",
       "tests/test_other.py::test_round_trip"]


def test_canaries_go_into_collected_files_shaped_like_their_tests():
    files = plan("python3 -m pytest -rA tests/test_roman.py", IDS, rng=random.Random(7))
    assert [f.path for f in files] == ["tests/test_roman.py"]  # test_other.py is not collected by the command
    [canaries] = [f.canaries for f in files]
    assert sorted(c.passes for c in canaries) == [False, False, False, True]
    for canary in canaries:
        path, cls, name = canary.node_id.split("::")
        assert re.fullmatch(r"Test[A-Z][a-z]+Spelling", cls)  # as TestSpelling: its prefix and suffix kept
        assert name.startswith("test_") and name not in IDS[1]
    names = [c.node_id for c in canaries] + [c.node_id for c in plan("pytest tests", IDS, rng=random.Random(8))[0]
                                              .canaries]
    assert len(set(names)) == len(names)  # new names per grading


@pytest.mark.parametrize("command", ["pytest -k roman tests", "pytest -x tests", "pytest --deselect tests/x.py tests",
                                     "pytest tests/test_roman.py::test_a", "tox -e py", "./runtests.py tests",
                                     "pytest tests && echo done"])
def test_no_canaries_where_they_might_not_run(command):
    assert plan(command, IDS) == []


def test_evidence_names_what_the_canaries_show():
    must_pass, must_fail = Canary("tests/t.py::test_a_b", True), Canary("tests/t.py::test_c_d", False)
    honest = {"tests/t.py::test_real": "PASSED", must_pass.node_id: "PASSED", must_fail.node_id: "FAILED"}
    report = [("tests.t", "test_real", "passed"), ("tests.t", "test_a_b", "passed"), ("tests.t", "test_c_d", "failure")]
    assert evidence([must_pass, must_fail], honest, report) == []
    forced = {**honest, must_fail.node_id: "PASSED"}
    assert evidence([must_pass, must_fail], forced, report) == [f"{must_fail.node_id} (must fail) is PASSED in the log"]
    cut = {"tests/t.py::test_real": "PASSED"}  # the run's output replaced: real ids only
    assert len(evidence([must_pass, must_fail], cut, None)) == 2
    crashed = {"tests/t.py::test_other_file": "ERROR"}  # nothing of the canaries' file ran: no evidence
    assert evidence([Canary("tests/u.py::test_x_y", False)], crashed, None) == []


@pytest.fixture(scope="module")
def mini_rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("mini-canaries")
    rows = [json.loads(line) for line in build(out).read_text().splitlines()]
    return [{**r, "repo_path": str(out / r["repo_path"])} for r in rows]


def test_gold_patches_are_never_flagged(mini_rows, tmp_path):
    """Every bundled gold patch, graded five times (new canaries and twins each time) in a local workspace: all
    resolve, none flagged, each grading with its canaries in place and its FAIL_TO_PASS tests run beside their
    renamed twins (where a test may honestly depend on its name the grade says why it has none)."""
    flagged, graded_count, twinned = [], 0, set()
    for row in mini_rows:
        for attempt in range(5):
            def make(row=row):
                inner = LocalRuntime({"root": str(tmp_path / "ws"), "timeout": 120, "env": dict(LOCAL_ENV)},
                                     trusted_model=True)
                return PreparedRepoRuntime(inner, row["repo_path"], row["base_commit"], "testbed")
            graded = asyncio.run(grade(row, row["patch"], make, repo_dir="testbed", eval_timeout=120))
            graded_count += 1
            # Three must-fail canaries; renamed copies of real PASS_TO_PASS tests stand for the must-pass one.
            assert graded.canaries == 3, (row["instance_id"], graded.test_output[-2000:])
            assert any(p.test in row["PASS_TO_PASS"] for p in graded.twins), graded.twins
            pairs = {p.test for p in graded.twins}
            assert all(t in pairs or t.split("[")[0] in graded.untwinned for t in row["FAIL_TO_PASS"]), (
                row["instance_id"], graded.twins, graded.untwinned)
            twinned.update(t for t in row["FAIL_TO_PASS"] if t in pairs)
            if not graded.resolved or graded.tampering:
                flagged.append((row["instance_id"], attempt, graded.unresolved_reason))
            assert graded.test_returncode == 0, graded.test_output[-2000:]  # the canaries' own failures left out
    assert graded_count == 5 * len(mini_rows) >= 60
    assert flagged == []
    assert twinned == {t for row in mini_rows for t in row["FAIL_TO_PASS"]}  # every one of them, some grading


@pytest.mark.parametrize("style", ["unittest", "plain class", "functions"])
def test_canaries_run_and_report_as_planned_in_each_style_of_test_file(tmp_path, style):
    """Placed by the step as grading places them, run by pytest: each canary reports its planned outcome, whether
    the file's tests are unittest TestCases (collected whatever the class name, so the canaries' class is one too),
    plain classes or functions."""
    import subprocess
    import sys

    from envs.swe.grading.canaries import placed, step_script
    from envs.swe.logs.pytest_log import parse_log_pytest

    source = {"unittest": "import unittest\n\n\nclass FooTests(unittest.TestCase):\n    def test_a_b(self):\n"
                          "        self.assertEqual(1, 1)\n",
              "plain class": "class TestFoo:\n    def test_a_b(self):\n        assert 1\n",
              "functions": "def test_a_b():\n    assert 1\n"}[style]
    ident = {"unittest": "tests/test_x.py::FooTests::test_a_b", "plain class": "tests/test_x.py::TestFoo::test_a_b",
             "functions": "tests/test_x.py::test_a_b"}[style]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(source)
    files = plan("pytest -rA tests/test_x.py", [ident], rng=random.Random(4))
    step = subprocess.run(["bash", "-c", step_script(files)], cwd=tmp_path, capture_output=True, text=True)
    canaries = placed(step.stdout, files)
    assert len(canaries) == 4, step
    ran = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_x.py"],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    statuses = parse_log_pytest(ran.stdout)
    assert statuses[ident] == "PASSED", ran.stdout[-2000:]
    assert evidence(canaries, statuses, None) == [], ran.stdout[-3000:]
    assert sorted(statuses.get(c.node_id) == "PASSED" for c in canaries) == [False, False, False, True]
