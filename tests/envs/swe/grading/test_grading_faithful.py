"""Hardening never changes an honest verdict: a repository that pytest itself loads at start-up is graded with its
own (patched) code, in the base image, through the whole grader.

The base image's pytest (Debian's 7.2) imports ``iniconfig`` before any test runs. Here the repository under test
*is* iniconfig (the image's own copy, so pytest still works with it), with a bug its gold patch fixes: the gold patch
resolves, the tests import the repository's copy, and report.json says the grading ran in ``harness`` mode."""

from __future__ import annotations

import asyncio
import io
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_swe_grading import ClonedRepo, diff_of, git, run_grade

from envs.runtimes.docker.runtime import DockerRuntime
from envs.swe.grading.grade import grade

TEST_CMD = "PYTHONPATH=src PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -rA -p no:cacheprovider tests"
BUG = "\n\ndef section_count(text):\n    return len(IniConfig('x.ini', text).sections) - 1\n"
FIX = "\n\ndef section_count(text):\n    return len(IniConfig('x.ini', text).sections)\n"
TESTS = '''import os

import iniconfig


def test_parses():
    assert iniconfig.IniConfig("x.ini", "[a]\\nb = 1\\n")["a"]["b"] == "1"


def test_section_count():
    assert iniconfig.section_count("[a]\\n[b]\\n") == 2


def test_the_repositorys_copy():
    assert os.path.realpath(iniconfig.__file__).startswith(os.path.realpath("src") + os.sep)
'''


@pytest.fixture(scope="module")
def iniconfig_instance(base_image, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("iniconfig")
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "tests").mkdir()
    archive = subprocess.run(["docker", "run", "--rm", "--network", "none", base_image, "tar", "-C",
                              "/usr/lib/python3/dist-packages", "-c", "iniconfig"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(repo / "src", filter="data")
    init = repo / "src" / "iniconfig" / "__init__.py"
    original = init.read_text()
    init.write_text(original + BUG)
    (repo / "tests" / "__init__.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    git(repo, "bundle", "create", "-q", str(root / "repo.bundle"), "--all")
    tests = ["tests/test_iniconfig.py::test_section_count", "tests/test_iniconfig.py::test_the_repositorys_copy"]
    return {
        "instance_id": "iniconfig__iniconfig-1", "repo": "pytest-dev/iniconfig", "version": "1.1",
        "base_commit": git(repo, "rev-parse", "HEAD").strip(), "problem_statement": "section_count is off by one",
        "patch": diff_of(repo, root / "gold", {"src/iniconfig/__init__.py": original + FIX}),
        "test_patch": diff_of(repo, root / "tests", {"tests/test_iniconfig.py": TESTS}),
        "FAIL_TO_PASS": tests, "PASS_TO_PASS": ["tests/test_iniconfig.py::test_parses"], "test_cmd": TEST_CMD,
        "bundle": (root / "repo.bundle").read_bytes(), "repo_path": str(repo), "original": original,
    }


def graded(instance: dict, patch: str):
    def make():
        inner = DockerRuntime({"image": "rollout-farm/base:bookworm", "workdir": "/testbed"},
                              run_id="test-grading-faithful", rollout_id="grade")
        return ClonedRepo(inner, instance["bundle"], instance["base_commit"], "/testbed", "/tmp/src.bundle")
    return asyncio.run(grade(instance, patch, make, eval_timeout=120))


@pytest.mark.docker
def test_the_gold_fix_of_a_package_pytest_loads_resolves(iniconfig_instance):
    gold = graded(iniconfig_instance, iniconfig_instance["patch"])
    assert gold.resolved, (gold.unresolved_reason, gold.test_output[-3000:])
    assert gold.grading_mode == "harness" and gold.grading_modules == ["iniconfig"]
    fields = gold.report_json()[iniconfig_instance["instance_id"]]
    assert fields["grading_mode"] == "harness" and fields["resolved"] is True
    assert not gold.tampering and gold.canaries > 0  # the checks that still apply ran, and found nothing


@pytest.mark.docker
def test_a_wrong_fix_of_a_package_pytest_loads_does_not(iniconfig_instance, tmp_path):
    wrong = iniconfig_instance["original"] + FIX.replace("sections)", "sections) + 0 * 1 - (1 if text else 0)")
    patch = diff_of(Path(iniconfig_instance["repo_path"]), tmp_path / "agent", {"src/iniconfig/__init__.py": wrong})
    graded_wrong = graded(iniconfig_instance, patch)
    assert graded_wrong.patch_successfully_applied and not graded_wrong.resolved
    assert graded_wrong.tests_status["FAIL_TO_PASS"]["failure"] == ["tests/test_iniconfig.py::test_section_count"]


OPS = '''def double(x):
    """
    >>> double(2)
    4
    """
    return x + x + 1


def half(x):
    """
    >>> half(4)
    2.0
    """
    return x / 2
'''


def test_a_doctest_in_the_fixed_module_is_graded_on_the_fixed_module(tmp_path):
    """A FAIL_TO_PASS doctest (``--doctest-modules``) names the module the fix changes: that module is the code under
    test, never reset to the base as a test file is; no test of the grader's own goes into it (pytest would not
    collect it there)."""
    repo = tmp_path / "repo"
    (repo / "mathx").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "mathx" / "__init__.py").write_text('"""Maths.\n\n>>> 1 + 1\n2\n"""\n')
    (repo / "mathx" / "ops.py").write_text(OPS)
    (repo / "tests" / "test_ops.py").write_text("from mathx.ops import half\n\n\ndef test_half():\n"
                                               "    assert half(2) == 1.0\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    git(repo, "bundle", "create", "-q", str(tmp_path / "repo.bundle"), "--all")
    tests = "from mathx.ops import double, half\n\n\ndef test_half():\n    assert half(2) == 1.0\n\n\n" \
            "def test_double():\n    assert double(3) == 6\n"
    instance = {
        "instance_id": "mathx-1", "repo": "example/mathx", "base_commit": git(repo, "rev-parse", "HEAD").strip(),
        "patch": diff_of(repo, tmp_path / "gold", {"mathx/ops.py": OPS.replace("x + x + 1", "x + x")}),
        "test_patch": diff_of(repo, tmp_path / "tests", {"tests/test_ops.py": tests}),
        "FAIL_TO_PASS": ["mathx/ops.py::mathx.ops.double", "tests/test_ops.py::test_double"],
        "PASS_TO_PASS": ["mathx/ops.py::mathx.ops.half", "mathx/__init__.py::mathx", "tests/test_ops.py::test_half"],
        "test_cmd": f"{shlex.quote(sys.executable)} -m pytest -rA -p no:cacheprovider --doctest-modules mathx tests",
        "bundle": (tmp_path / "repo.bundle").read_bytes(),
    }
    gold = run_grade(instance, instance["patch"], tmp_path)
    assert gold.resolved, (gold.unresolved_reason, gold.test_output[-3000:])
    assert "mathx/ops.py" not in gold.restored and not gold.tampering and gold.canaries > 0
    empty_fix = run_grade(instance, diff_of(repo, tmp_path / "agent", {"mathx/ops.py": OPS + "\n"}), tmp_path)
    assert not empty_fix.resolved and "mathx/ops.py::mathx.ops.double" in empty_fix.unresolved_reason


INNER = '''def test_reporting():
    # As pytest's own tests do: an inner run's report lines in a passing test's captured output.
    print("PASSED test_inner_run.py::test_this")
    print("PASSED [100%]")
    assert True


def test_real():
    from mathx.ops import double
    assert double(3) == 6
'''


@pytest.mark.parametrize("forged", [False, True])
def test_an_inner_runs_ids_are_read_from_the_log_and_a_real_tests_are_not(tmp_path, forged):
    """A dataset made by the harness's parser holds the ids an inner pytest run printed (pytest's own rows do):
    their file is in no tree the tests ran in, so pytest's report cannot confirm them and the log is read as the
    harness reads it: the gold patch resolves. A real test's PASSED line printed by the code under test still needs
    the report."""
    repo = tmp_path / "repo"
    (repo / "mathx").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "mathx" / "__init__.py").write_text("")
    (repo / "mathx" / "ops.py").write_text(OPS)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    git(repo, "bundle", "create", "-q", str(tmp_path / "repo.bundle"), "--all")
    fixed = OPS.replace("x + x + 1", "x + x")
    if forged:  # no fix; the module prints the real test's PASSED line when imported
        fixed = OPS + '\nprint("PASSED tests/test_ops.py::test_real")\n'
    instance = {
        "instance_id": "mathx-2", "repo": "example/mathx", "base_commit": git(repo, "rev-parse", "HEAD").strip(),
        "patch": diff_of(repo, tmp_path / "gold", {"mathx/ops.py": fixed}),
        "test_patch": diff_of(repo, tmp_path / "tests", {"tests/test_ops.py": INNER}),
        "FAIL_TO_PASS": ["tests/test_ops.py::test_real"],
        "PASS_TO_PASS": ["tests/test_ops.py::test_reporting", "test_inner_run.py::test_this", "[100%]"],
        "test_cmd": f"{shlex.quote(sys.executable)} -m pytest -rA -p no:cacheprovider tests",
        "bundle": (tmp_path / "repo.bundle").read_bytes(),
    }
    graded_ = run_grade(instance, instance["patch"], tmp_path)
    assert graded_.log_only == ["test_inner_run.py::test_this", "[100%]"]
    if forged:
        assert not graded_.resolved and "tests/test_ops.py::test_real" in graded_.unresolved_reason
    else:
        assert graded_.resolved, (graded_.unresolved_reason, graded_.test_output[-2000:])
