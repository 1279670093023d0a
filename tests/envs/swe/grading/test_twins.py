"""Twins: which tests get a renamed copy, that honest tests and their twins report alike (per parameter id, in the log
and in pytest's report), and what a forced original shows against its twin."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from envs.swe.grading.twins import Twin, evidence, placed, plan, skipped, step_script
from envs.swe.logs.pytest_log import parse_log_pytest
from envs.swe.logs.pytest_report import read_junit

TESTS = '''import unittest

import pytest

LIMITS = [1, 2]


@pytest.fixture
def named(request):
    return request.node.name


@pytest.fixture
def plain():
    return 3


def test_plain_function(plain):
    assert plain == 3


@pytest.mark.parametrize("n", [1, 2, 3])
def test_parametrized_values(n):
    assert n != 2


@pytest.mark.xfail(reason="known")
def test_expected_to_fail_here():
    assert False


def test_reads_its_own_node(request):
    assert request.node.name.startswith("test_reads")


def test_uses_a_named_fixture(named):
    assert named


def test_names_itself_inside():
    assert test_names_itself_inside.__doc__ is None


def test_nothing_imported_it_yet():
    import sys
    assert "a_module_no_test_imports" not in sys.modules


class TestGroup:
    factor = 2

    def setup_method(self, method):
        self.base = 10

    def test_method_uses_setup(self):
        assert self.base * self.factor == 20

    @pytest.mark.parametrize("x", LIMITS)
    def test_method_parametrized(self, x):
        assert x in LIMITS

    @pytest.mark.parametrize("x", [factor])
    def test_decorator_uses_class_body(self, x):
        assert x == 2


class Base:
    def helper(self):
        return 1


class TestChild(Base):
    def test_calls_super_helper(self):
        assert super().helper() == 1


class CaseTests(unittest.TestCase):
    def setUp(self):
        self.value = 5

    def test_unittest_method(self):
        self.assertEqual(self.value, 5)

    def test_unittest_failing(self):
        self.assertEqual(self.value, 6)
'''
PATH = "tests/test_mixed.py"
IDS = [f"{PATH}::test_plain_function", f"{PATH}::test_parametrized_values[1]", f"{PATH}::test_expected_to_fail_here",
       f"{PATH}::test_reads_its_own_node", f"{PATH}::test_uses_a_named_fixture", f"{PATH}::test_names_itself_inside",
       f"{PATH}::TestGroup::test_method_uses_setup", f"{PATH}::TestGroup::test_method_parametrized[1]",
       f"{PATH}::TestGroup::test_decorator_uses_class_body[2]", f"{PATH}::TestChild::test_calls_super_helper",
       f"{PATH}::CaseTests::test_unittest_method", f"{PATH}::CaseTests::test_unittest_failing"]
PASSING = [f"{PATH}::test_nothing_imported_it_yet"]
TWINNED = {"test_plain_function", "test_parametrized_values", "test_expected_to_fail_here", "test_method_uses_setup",
           "test_method_parametrized", "test_unittest_method", "test_unittest_failing"}
"""The tests a renamed copy of which behaves as they do; the others read their name, rely on their class or on
names of its body, or on what the process had not imported yet."""


def run_pytest(root, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args], cwd=root,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin",
                                                               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})


def test_twins_are_named_like_the_tests_and_never_after_them():
    ids = ["t/test_a.py::test_read_value_twice", "t/test_a.py::TestX::testCamelCase[1]", "t/test_b.py::test_other"]
    twins = plan("pytest -rA t/test_a.py", ids, ["t/test_a.py::test_keep"], rng=random.Random(3))
    assert [(t.classes, t.function) for t in twins] == [((), "test_read_value_twice"), (("TestX",), "testCamelCase"),
                                                        ((), "test_keep")]  # test_b.py is not collected
    for twin in twins:
        assert twin.name.startswith("test") and twin.function not in twin.name and twin.name != twin.function
    assert twins[0].name.endswith("_twice") and twins[1].name.endswith("Case")
    assert twins[1].name > "testCamelCase"  # unittest runs a class's tests by name: the original first
    assert plan("pytest -k read t/test_a.py", ids, []) == []  # what runs is narrowed: a twin might not
    again = plan("pytest -rA t/test_a.py", ids, [], rng=random.Random(4))
    assert {t.name for t in again}.isdisjoint(t.name for t in twins)  # new names per grading
    [bare] = plan("pytest t.py", ["t.py::test[a]"], ["t.py::test[b]"], rng=random.Random(5))  # the prefix alone
    assert bare.name.startswith("test") and bare.name != "test"


def test_honest_tests_and_their_twins_report_alike(tmp_path):
    """The step, as grading runs it, on a file of many kinds of tests: the ones that can be copied faithfully get a
    twin (functions, parameters, xfail, methods with setup, unittest), the others say why not; run by pytest,
    every twin reports as its original, parameter by parameter, in the log and in the report."""
    (tmp_path / "tests").mkdir()
    (tmp_path / PATH).write_text(TESTS)
    twins = plan(f"pytest -rA {PATH}", IDS, PASSING, rng=random.Random(5))
    step = subprocess.run(["bash", "-c", step_script(twins)], cwd=tmp_path, capture_output=True, text=True)
    made = placed(step.stdout, twins)
    assert {t.function for t in made} == TWINNED, step.stdout
    why = skipped(step.stdout, twins)
    assert set(why) == {t.split("[")[0] for t in IDS + PASSING} - {t.original for t in made}, why
    assert why[f"{PATH}::test_reads_its_own_node"] == "it reads its own name or node"
    assert why[f"{PATH}::test_uses_a_named_fixture"] == "a fixture it uses reads its name"
    assert why[f"{PATH}::test_names_itself_inside"] == "it names itself"
    assert "super()" in why[f"{PATH}::TestChild::test_calls_super_helper"]
    assert why[f"{PATH}::test_nothing_imported_it_yet"].startswith("it imports, reloads or checks modules")
    appended = (tmp_path / PATH).read_text()[len(TESTS):]
    assert not any(t.function in appended for t in made)  # nothing in the twins names the originals
    ran = run_pytest(tmp_path, f"--junitxml={tmp_path / 'report.xml'}", PATH)
    statuses = parse_log_pytest(ran.stdout)
    pairs, found = evidence(made, statuses, read_junit((tmp_path / "report.xml").read_bytes()))
    assert found == [], ran.stdout[-3000:]
    assert {p.test for p in pairs} >= {f"{PATH}::test_parametrized_values[{n}]" for n in (1, 2, 3)}
    by_test = {p.test: p for p in pairs}
    assert by_test[f"{PATH}::test_parametrized_values[2]"].twin_status == "FAILED"  # failing alike is alike
    assert by_test[f"{PATH}::test_expected_to_fail_here"].twin_report == "xfail"
    assert by_test[f"{PATH}::CaseTests::test_unittest_failing"].twin_status == "FAILED"
    assert len(pairs) == 10  # 1 + 3 + 1 + 1 + 2 + 2: no test ran twice under another class


def test_a_forced_original_shows_against_its_twin():
    twin = Twin("t/test_a.py", ("TestX",), "test_fixed_now", "test_other_words_now")
    original, copy = "t/test_a.py::TestX::test_fixed_now", "t/test_a.py::TestX::test_other_words_now"
    honest = {f"{original}[a]": "FAILED", f"{copy}[a]": "FAILED", f"{original}[b]": "SKIPPED", f"{copy}[b]": "PASSED"}
    pairs, found = evidence([twin], honest, None)
    assert found == [] and len(pairs) == 2  # a skip against a pass is no evidence (a mark by name, honestly)
    forced = {**honest, "t/test_a.py::TestX::test_fixed_now[a]": "PASSED"}
    _, found = evidence([twin], forced, None)
    assert found == ["t/test_a.py::TestX::test_fixed_now[a] is PASSED and its renamed twin "
                     "t/test_a.py::TestX::test_other_words_now[a] is FAILED in the log"]
    report = [("t.test_a.TestX", "test_fixed_now[a]", "passed"),
              ("t.test_a.TestX", "test_other_words_now[a]", "failure")]
    _, found = evidence([twin], honest, report)
    assert found == ["t/test_a.py::TestX::test_fixed_now[a] is passed and its renamed twin "
                     "t/test_a.py::TestX::test_other_words_now[a] is failure in pytest's report"]
    gone = {f"{original}[a]": "PASSED"}
    _, found = evidence([twin], gone, None)
    assert found and "missing from the log" in found[0]


@pytest.mark.parametrize("source", ["def test_x(:\n", "\xff\xfe not text"])
def test_a_file_the_step_cannot_read_gets_no_twin_and_the_step_goes_on(tmp_path, source):
    (tmp_path / "test_bad.py").write_bytes(source.encode("latin-1"))
    twins = plan("pytest -rA test_bad.py", ["test_bad.py::test_x"], [], rng=random.Random(1))
    step = subprocess.run(["bash", "-c", step_script(twins) + "\necho rc=$?"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert placed(step.stdout, twins) == [] and "rc=0" in step.stdout and "file not read" in step.stdout
