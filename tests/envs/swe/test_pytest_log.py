"""Pytest log parsing: real pytest -rA output and hand-written edge cases, read as the SWE-bench harness reads them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envs.swe.logs.pytest_log import END_MARKER, START_MARKER, eval_section, parse_log_pytest, parse_test_statuses

SAMPLE_TESTS = '''
import pytest

class TestY:
    def test_z(self):
        pass

    @pytest.mark.parametrize("p", ["one two", "x[1]", "caf\\u00e9", "a - b", "plain"])
    def test_param(self, p):
        assert p != "a - b", "dash - in - message"

def test_fail():
    assert 1 == 2, "boom - with a dash"

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False

@pytest.mark.xfail(reason="fixed already")
def test_xpass():
    pass

@pytest.mark.xfail(strict=True)
def test_xpass_strict():
    pass

@pytest.mark.skip(reason="not on this machine")
def test_skip():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_error(broken):
    pass

def test_prints():
    print("PASSED fake/line.py::printed_not_run")
'''

HANDWRITTEN = {
    "old pytest: xfail reason on the next line, xpass": (
        "XFAIL tests/test_a.py::test_x\n  reason: bug\nXPASS tests/test_a.py::test_y fixed\n"
        "PASSED tests/test_a.py::test_z\n"),
    "crlf line ends": "PASSED tests/a.py::test_a\r\nFAILED tests/a.py::test_b - assert 0\r\nERROR tests/a.py::c\r\n",
    "odd lines": (
        "PASSED\nFAILED - tests/a.py::x - y\nERROR: file or directory not found: tests/missing.py\n"
        "PASSED:  tests/a.py::glued\nPASSEDx y\n  PASSED tests/a.py::indented\nSKIPPED [2] tests/a.py:10: why\n"
        "FAILED tests/a.py::t[a - b] - AssertionError: x - y\nFAILED tests/a.py::u[q] - assert [1] == [2]\n"),
    "unicode whitespace in an id": "PASSED tests/a.py::test_x[a\u00a0b]\nPASSED tests/a.py::test_y[tab\tsep]\n",
    "a later line wins": "FAILED tests/a.py::t - x\nPASSED tests/a.py::t\n",
    "ids with spaces and brackets": (
        "PASSED tests/a b/test_c.py::T::test_d[one two]\nFAILED tests/a.py::test_e[[x] y] - ValueError: [x] - y\n"
        "XFAIL tests/a.py::test_f[p q] - reason: later\n"),
    "coloured": "\x1b[32mPASSED\x1b[0m tests/a.py::test_c\n\x1b[31mFAILED\x1b[0m tests/a.py::test_d - x\n",
    "empty": "",
    "markers": f"PASSED outside::before\n{START_MARKER}\nPASSED inside::t\n{END_MARKER}\nFAILED outside::after - x\n",
}


def _run_pytest_all(root, runs: dict[str, list[str]]) -> dict[str, str]:
    """Run pytest once per entry, all at once (plugins not autoloaded: they only slow the start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PY_COLORS", "FORCE_COLOR", "NO_COLOR"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    procs = {name: subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=root,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, args in runs.items()}
    return {name: proc.communicate(timeout=120)[0] for name, proc in procs.items()}


@pytest.fixture(scope="module")
def real_logs(tmp_path_factory) -> dict[str, str]:
    """Logs of real pytest runs over one sample module: plain, verbose with durations, coloured, quiet,
    and with a module that fails to import (interrupted, and continued past)."""
    good_root, broken_root = tmp_path_factory.mktemp("sample"), tmp_path_factory.mktemp("broken")
    for root in (good_root, broken_root):
        (root / "tests").mkdir()
        (root / "tests" / "test_sample.py").write_text(SAMPLE_TESTS)
    broken = "import not_a_module_anywhere\n\n\ndef test_never():\n    pass\n"
    (broken_root / "tests" / "test_broken.py").write_text(broken)
    good = "tests/test_sample.py"
    logs = _run_pytest_all(good_root, {
        "-rA": ["-rA", good], "-rA -v --durations=0": ["-rA", "-v", "--durations=0", good],
        "-rA --color=yes": ["-rA", "--color=yes", good], "-rA -q": ["-rA", "-q", good],
    })
    logs.update(_run_pytest_all(broken_root, {
        "collection error": ["-rA", "tests"],
        "collection error, continued": ["-rA", "--continue-on-collection-errors", "tests"],
    }))
    return logs


def all_logs(real: dict[str, str]) -> dict[str, str]:
    return {**{f"real {k}": v for k, v in real.items()}, **HANDWRITTEN}


def test_real_log_statuses(real_logs):
    got = parse_log_pytest(real_logs["-rA"])
    base = "tests/test_sample.py"
    assert got[f"{base}::TestY::test_z"] == "PASSED"
    assert got[f"{base}::TestY::test_param[plain]"] == "PASSED"
    assert got[f"{base}::TestY::test_param[x[1]]"] == "PASSED"
    assert got[f"{base}::TestY::test_param[caf\\xe9]"] == "PASSED"  # pytest escapes non-ASCII ids
    assert got[f"{base}::test_fail"] == "FAILED"  # the " - message" is not part of the id
    assert got[f"{base}::test_xfail"] == "XFAIL"
    assert got[f"{base}::test_xpass_strict"] == "FAILED"
    assert got[f"{base}::test_error"] == "ERROR"
    assert f"{base}::test_xpass" not in got  # XPASS is not a harness status
    assert "fake/line.py::printed_not_run" in got  # captured output is read too, as the harness does
    # The harness cuts ids at whitespace; the whole id is there only in parse_test_statuses.
    assert got[f"{base}::TestY::test_param[one"] == "PASSED"
    assert got[f"{base}::TestY::test_param[a"] == "FAILED"
    assert f"{base}::TestY::test_param[one two]" not in got
    whole = parse_test_statuses(real_logs["-rA"])
    assert whole[f"{base}::TestY::test_param[one two]"] == "PASSED"
    assert whole[f"{base}::TestY::test_param[a - b]"] == "FAILED"


def test_collection_errors(real_logs):
    interrupted = parse_log_pytest(real_logs["collection error"])
    assert interrupted["tests/test_broken.py"] == "ERROR"
    assert "tests/test_sample.py::TestY::test_z" not in interrupted  # nothing ran
    continued = parse_log_pytest(real_logs["collection error, continued"])
    assert continued["tests/test_broken.py"] == "ERROR"
    assert continued["tests/test_sample.py::TestY::test_z"] == "PASSED"


def test_colour_and_verbosity(real_logs):
    plain = parse_log_pytest(real_logs["-rA"])
    assert parse_log_pytest(real_logs["-rA -q"]) == plain
    assert parse_log_pytest(real_logs["-rA -v --durations=0"]) == plain
    # Coloured summary lines are invisible to the harness; parse_test_statuses recovers them.
    assert "tests/test_sample.py::TestY::test_z" not in parse_log_pytest(real_logs["-rA --color=yes"])
    assert parse_test_statuses(real_logs["-rA --color=yes"]) == parse_test_statuses(real_logs["-rA"])


def test_handwritten_edge_cases():
    odd = parse_log_pytest(HANDWRITTEN["odd lines"])
    # The harness takes the first word as the status, whatever it is.
    assert odd["[2]"] == "SKIPPED" and odd["file"] == "ERROR:" and odd["tests/a.py::glued"] == "PASSED:"
    assert odd["y"] == "PASSEDx" and "tests/a.py::x" in odd
    assert "tests/a.py::indented" not in odd
    assert odd["tests/a.py::t[a"] == "FAILED" and odd["tests/a.py::u[q]"] == "FAILED"
    whole = parse_test_statuses(HANDWRITTEN["odd lines"])
    assert whole["tests/a.py::t[a - b]"] == "FAILED" and "tests/a.py::u[q] - assert [1]" not in whole
    assert parse_log_pytest(HANDWRITTEN["crlf line ends"]) == {
        "tests/a.py::test_a": "PASSED", "tests/a.py::test_b": "FAILED", "tests/a.py::c": "ERROR"}
    assert parse_log_pytest(HANDWRITTEN["a later line wins"]) == {"tests/a.py::t": "PASSED"}
    spaced = parse_test_statuses(HANDWRITTEN["ids with spaces and brackets"])
    assert spaced["tests/a b/test_c.py::T::test_d[one two]"] == "PASSED"
    assert spaced["tests/a.py::test_e[[x] y]"] == "FAILED"
    assert spaced["tests/a.py::test_f[p q]"] == "XFAIL"
    assert parse_test_statuses(HANDWRITTEN["unicode whitespace in an id"])["tests/a.py::test_x[a\u00a0b]"] == "PASSED"
    assert parse_log_pytest(eval_section(HANDWRITTEN["markers"])) == {"inside::t": "PASSED"}
    assert eval_section("no markers here") == "no markers here"


@pytest.mark.parametrize("name", sorted(HANDWRITTEN) + ["real"])
def test_whole_ids_never_contradict_the_harness(name, real_logs):
    logs = all_logs(real_logs) if name == "real" else {name: HANDWRITTEN[name]}
    for text in logs.values():
        harness, ours = parse_log_pytest(text), parse_test_statuses(text)
        assert {k: ours[k] for k in harness} == harness


def test_agrees_with_the_swebench_harness(real_logs):
    """Our parser and swebench 4.1's, on every log of this file (skipped without the optional package)."""
    try:
        from swebench.harness.log_parsers.python import parse_log_pytest as official
    except Exception as exc:  # noqa: BLE001 - not installed, or installed without its dependencies
        pytest.skip(f"swebench is not importable: {exc}")
    import swebench

    assert swebench.__version__.startswith("4.1.")
    for name, text in all_logs(real_logs).items():
        assert parse_log_pytest(text) == official(text, None), name


def test_the_junit_report_confirms_every_passing_test_of_a_real_log_and_no_forged_one(tmp_path):
    """pytest's junitxml report of a real run confirms each test its log shows passing (whole ids and ids cut at
    a space, PASSED and XFAIL); a PASSED line printed for a failing test is not confirmed."""
    from envs.swe.logs.pytest_report import read_junit, unconfirmed, wants_report

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_sample.py").write_text(SAMPLE_TESTS)
    report = tmp_path / "out" / "report.xml"
    log = _run_pytest_all(tmp_path, {"run": ["-rA", f"--junitxml={report}", "tests/test_sample.py"]})["run"]
    cases = read_junit(report.read_bytes())
    for parse in (parse_log_pytest, parse_test_statuses):
        statuses = parse(log)
        assert "tests/test_sample.py::TestY::test_param[one" in statuses or parse is parse_test_statuses
        # The sample's test_prints prints a PASSED line for a test that never ran: the only one not confirmed.
        assert unconfirmed(statuses, cases, list(statuses)) == ["fake/line.py::printed_not_run"]
        forged = parse(log + "PASSED tests/test_sample.py::test_fail\nPASSED tests/test_sample.py::test_error\n")
        assert set(unconfirmed(forged, cases, list(forged))) == {
            "tests/test_sample.py::test_fail", "tests/test_sample.py::test_error", "fake/line.py::printed_not_run"}
        assert unconfirmed(forged, None, ["tests/test_sample.py::TestY::test_z"]) == [
            "tests/test_sample.py::TestY::test_z"]
    assert read_junit(b"") is None and read_junit(b"<testsuites><testcase") is None
    assert wants_report("python3 -m pytest -rA tests") and wants_report("PYTHONPATH=src py.test x")
    assert not wants_report("./runtests.py --verbosity 2") and not wants_report("tox -epy39 -- pytest")
