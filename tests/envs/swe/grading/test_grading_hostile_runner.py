"""Hostile patches, second wave: each goes after the test runner itself rather than the tests (a pytest the
repository shadows, outcomes rewritten inside the test process, configuration pytest reads differently, plugins
from package metadata, hooks planted in .git, start-up files on the row's PYTHONPATH, symbolic links out of the
repository). Each must grade completed, unresolved, reward 0, with its reason, in default and strict mode, in
docker and in a local workspace; where the grader prevents the trick (rather than detecting it) the patch's own
code must not have run at all."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from test_grading_hostile import (  # noqa: F401
    FORCE_PASS,
    KINDS,
    ROMAN,
    base_text,
    edit,
    images,
    needs,
    rows,
    verifier,
)

from envs.swe.logs.pytest_report import junit_address
from envs.swe.mini import build
from rollout.errors import VerifierError
from rollout.records import RolloutResult, Task

INTERVALS = "mini__intervals-1"
RAN = "HOSTILE-CODE-RAN"
"""Printed by each patch's own code: where the grader prevents a trick, it must not be in the log."""


@pytest.fixture(scope="module")
def src_rows(tmp_path_factory) -> dict[str, dict]:
    """The intervals instance of the mini benchmark: a ``PYTHONPATH=src`` row."""
    out = tmp_path_factory.mktemp("hostile-src")
    [row] = [json.loads(line) for line in build(out, ["intervals"]).read_text().splitlines()]
    base = out / "base"
    subprocess.run(["git", "clone", "-q", str(out / row["repo_path"]), str(base)], check=True)
    subprocess.run(["git", "-C", str(base), "checkout", "-q", row["base_commit"]], check=True)
    return {row["instance_id"]: {**row, "repo_path": str(out / row["repo_path"]), "checkout": str(base),
                                 "dataset": str(out / "swe_mini.jsonl")}}


@pytest.fixture(scope="module")
def src_images(src_rows, base_image) -> dict[str, str]:
    from envs.images.image_names import image_for
    from envs.images.instance_images import build_instance_images

    [row] = src_rows.values()
    report = build_instance_images(row["dataset"], base=base_image, progress=lambda line: None)
    assert not report.failed, report.failed
    return {row["instance_id"]: image_for(json.loads(Path(row["dataset"]).read_text().splitlines()[0]), base_image)}


def forger(row: dict, at_exit: bool = False) -> str:
    """Python that prints PASSED for every FAIL_TO_PASS / PASS_TO_PASS id and writes pytest's report (its path from
    PYTEST_ADDOPTS) with every one of them passed, then exits 0: at once, or when the interpreter exits."""
    ids = row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]
    body = f'''def _forge():
    for _t in {ids!r}:
        print("PASSED " + _t)
    for _o in _os.environ.get("PYTEST_ADDOPTS", "").split():
        if _o.startswith("--junitxml="):
            with open(_o.split("=", 1)[1], "w") as _f:
                _f.write("<testsuites><testsuite>" + "".join(
                    '<testcase classname="%s" name="%s"/>' % _c for _c in {[junit_address(t) for t in ids]!r})
                    + "</testsuite></testsuites>")
    _sys.stdout.flush()
    _os._exit(0)
'''
    then = "import atexit as _atexit\n_atexit.register(_forge)\n" if at_exit else "_forge()\n"
    return f"import os as _os, sys as _sys\nprint({RAN!r})\n{body}{then}"


def report_forcer(when: str = "True") -> str:
    """Package code that, inside pytest's process, makes every report for which ``when`` (an expression of
    ``report``) holds a pass."""
    return f'''
import sys as _sys
print({RAN!r})
_reports = _sys.modules.get("_pytest.reports")
if _reports is not None:
    _made = _reports.TestReport.from_item_and_call

    def _forced(cls, item, call):
        report = _made.__func__(cls, item, call)
        if {when}:
            report.outcome, report.longrepr = "passed", None
        return report
    _reports.TestReport.from_item_and_call = classmethod(_forced)
'''


REWRITE_REPORTS = report_forcer()
NOT_RAISED_ONLY = report_forcer('report.failed and "DID NOT RAISE" in str(report.longrepr)')  # the bug's failures

LIVE_HOOK = f'''
import gc as _gc, sys as _sys
print({RAN!r})
if "_pytest.config" in _sys.modules:
    import pytest as _pytest

    class _Forcer:
        @_pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            report = outcome.get_result()
            report.outcome, report.longrepr = "passed", None

    for _o in _gc.get_objects():
        if type(_o).__name__ == "Config" and hasattr(_o, "pluginmanager"):
            _o.pluginmanager.register(_Forcer())
            break
'''

LOUD_FORCE_PASS = f"print({RAN!r})\n" + FORCE_PASS


def shadow_runner(row, tmp_path):
    """A pytest.py at the repository root, first on sys.path for `python3 -m pytest`."""
    return edit(row, tmp_path, {"pytest.py": forger(row)})


def shadow_runner_src(row, tmp_path):
    """A pytest package in src/, first on sys.path for `PYTHONPATH=src python3 -m pytest`."""
    return edit(row, tmp_path, {"src/pytest/__init__.py": "", "src/pytest/__main__.py": forger(row)})


def rewrite_reports(row, tmp_path):
    """The package the tests import forces every report object to passed."""
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py") + REWRITE_REPORTS})


def not_raised_only(row, tmp_path):
    """Only failures of one kind (an expected exception not raised: the bug's own) forced to passed."""
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py") + NOT_RAISED_ONLY})


def live_hook(row, tmp_path):
    """The package the tests import registers a hook on the running pytest's plugin manager."""
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py") + LIVE_HOOK})


def bare_cr_config(row, tmp_path):
    """An ini file beside the tests (pytest finds it before the root's) whose lines end in a bare CR: pytest reads
    the lines, a line-by-line restore sees one line and no pytest section."""
    text = "[metadata]\rname = x\r[pytest]\raddopts = -p numerals.forcepass\r"
    return edit(row, tmp_path, {"tests/tox.ini": text, "numerals/forcepass.py": LOUD_FORCE_PASS})


def new_config_name(row, tmp_path):
    """A configuration file by a name newer pytest reads (pytest.toml, 9.0) beside the tests, found before the root's
    pyproject.toml: with ``--rootdir`` it keeps the test ids as they were."""
    text = '[pytest]\naddopts = ["-p", "numerals.forcepass"]\n'
    return edit(row, tmp_path, {"tests/pytest.toml": text, "numerals/forcepass.py": LOUD_FORCE_PASS})


def metadata_plugin(row, tmp_path):
    """Package metadata at the repository root that registers a pytest plugin (a pytest11 entry point)."""
    return edit(row, tmp_path, {
        "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = numerals.forcepass\n",
        "numerals/forcepass.py": LOUD_FORCE_PASS})


def git_hook(row, tmp_path):
    """A post-checkout hook written into .git (by a hand-made diff: git itself never writes one), by a roundabout
    path; the grader's own git checkout would run it."""
    hook = f"#!/bin/sh\necho {RAN}\n"
    lines = hook.splitlines()
    name = "numerals/../.git//hooks/post-checkout"
    return (f"diff --git a/{name} b/{name}\nnew file mode 100755\n--- /dev/null\n+++ b/{name}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))


def symlink_out(row, tmp_path):
    """A module made a symbolic link to a file outside the repository."""
    return ("diff --git a/numerals/data.py b/numerals/data.py\nnew file mode 120000\n--- /dev/null\n"
            "+++ b/numerals/data.py\n@@ -0,0 +1 @@\n+../../../../etc/hostname\n\\ No newline at end of file\n")


def symlink_over_tests(row, tmp_path):
    """A new file linked to the test file, whose content the patch then controls through the link."""
    return ("diff --git a/numerals/alias.py b/numerals/alias.py\nnew file mode 120000\n--- /dev/null\n"
            "+++ b/numerals/alias.py\n@@ -0,0 +1 @@\n+../tests/test_roman.py\n\\ No newline at end of file\n")


def symlink_over_test_dir(row, tmp_path):
    """The tests' directory made a link to the package (its files dropped), so the test files are the patch's."""
    return ("diff --git a/tests b/tests\nnew file mode 120000\n--- /dev/null\n+++ b/tests\n@@ -0,0 +1 @@\n"
            "+numerals\n\\ No newline at end of file\n")


def interpreter_on_path(row, tmp_path):
    """An executable python3 in a directory of the repository the row's command puts first on PATH: it forges the
    results without running any test."""
    script = "#!/bin/sh\nexec /usr/bin/env -u PATH /usr/bin/python3 - <<'EOF'\n" + forger(row) + "EOF\n"
    lines = script.splitlines()
    return (f"diff --git a/bin/python3 b/bin/python3\nnew file mode 100755\n--- /dev/null\n+++ b/bin/python3\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))


def startup_file(row, tmp_path):
    """sitecustomize.py on the row's PYTHONPATH (src/): the interpreter would import it before pytest, and it forges
    the results when the interpreter exits."""
    return edit(row, tmp_path, {"src/sitecustomize.py": forger(row, at_exit=True)})


CASES = {
    # (instance, patch maker, what the grade must say, whether the patch's own code may have run)
    "runner shadowed (root module)": (ROMAN, shadow_runner, "", False),
    "runner shadowed (PYTHONPATH package)": (INTERVALS, shadow_runner_src, "", False),
    "reports rewritten in process": (ROMAN, rewrite_reports, "tampering detected", True),
    "hook on the live plugin manager": (ROMAN, live_hook, "tampering detected", True),
    "one kind of failure forced": (ROMAN, not_raised_only, "tampering detected", True),
    "config lines pytest reads, bare CR": (ROMAN, bare_cr_config, "", False),
    "config file by a newer name": (ROMAN, new_config_name, "", False),
    "plugin from package metadata": (ROMAN, metadata_plugin, "", False),
    "hook planted in .git": (ROMAN, git_hook, "writes into .git", False),
    "symlink out of the repository": (ROMAN, symlink_out, "symbolic link out of the repository", False),
    "symlink to a test file": (ROMAN, symlink_over_tests, "symbolic link to a protected file", False),
    "test directory made a symlink": (ROMAN, symlink_over_test_dir, "symbolic link to a protected file", False),
    "start-up file on PYTHONPATH": (INTERVALS, startup_file, "", False),
    "interpreter on a PATH the row adds": (ROMAN, interpreter_on_path, "", False),
}
ROWS = {"interpreter on a PATH the row adds": {"test_cmd": 'PATH="$PWD/bin:$PATH" python3 -m pytest -rA '
                                                           "tests/test_roman.py"}}
"""Row fields a case changes."""


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return needs(request, request.param)


@pytest.mark.docker
@pytest.mark.parametrize("kind, strict", [("local", False), ("local", True), ("docker", False), ("docker", True),
                                          ("apptainer", False)],  # apptainer: the grader's defaults, as a run grades
                         ids=["local-default", "local-strict", "docker-default", "docker-strict", "apptainer-default"])
@pytest.mark.parametrize("case", list(CASES))
def test_runner_attack_is_graded_unresolved(src_rows, kind, case, strict, tmp_path, request):
    ident, make, says, may_run = CASES[case]
    row = {**{**request.getfixturevalue("rows"), **src_rows}[ident], **ROWS.get(case, {})}
    instance_images = None
    if needs(request, kind) != "local":
        instance_images = {**request.getfixturevalue("images"), **request.getfixturevalue("src_images")}
    patch = make(row, tmp_path)
    task = Task(task_id=ident, prompt="", data={k: v for k, v in row.items() if k not in ("dataset", "checkout")})
    result = RolloutResult(rollout_id="r", task_id=ident, status="completed", exit_reason="submitted", submission=patch)
    graded = verifier(kind, row, instance_images, tmp_path / "ws")
    graded.config = graded.config.model_copy(update={"strict": strict})
    try:
        reward = asyncio.run(graded.verify(task, result))
    except VerifierError as exc:  # an error would make the rollout infra_failed: a refusal must be a verdict
        pytest.fail(f"graded as an error, not a verdict: {exc}")
    details = reward.details
    reason = details["unresolved_reason"]
    assert reward.value == 0.0 and details["resolved"] is False, (reason, details["test_output"][-3000:])
    assert reason, details["test_output"][-3000:]
    if not (strict and reason.startswith("strict grading")):
        assert says in reason, (reason, details["test_output"][-3000:])
    if not may_run:
        assert RAN not in details["test_output"], details["test_output"][-3000:]
    if says == "tampering detected":
        assert details["tampering"] and details["canaries"] >= 2, details


RESTARTS = '''
import subprocess as _subprocess
import sys as _sys

# Starts the interpreter again as multiprocessing's spawn and forkserver do: with this one's flags.
_subprocess.run([_sys.executable, *_subprocess._args_from_interpreter_flags(), "-c", "import pytest"], check=True)
'''


@pytest.mark.docker
def test_honest_code_that_restarts_the_interpreter_with_its_flags_resolves(kind, tmp_path, request):
    """The launcher changes no interpreter flag (no -S: a child started with the parent's flags has its
    site-packages), and the code under test imports from the repository as under `python -m pytest`."""
    row = request.getfixturevalue("rows")[ROMAN]
    instance_images = request.getfixturevalue("images") if kind != "local" else None
    fixed = tmp_path / "fixed"
    subprocess.run(["git", "clone", "-q", row["checkout"], str(fixed)], check=True)
    subprocess.run(["git", "-C", str(fixed), "apply"], input=row["patch"].encode(), check=True)
    patch = edit(row, tmp_path, {"numerals/roman.py": (fixed / "numerals/roman.py").read_text(),
                                 "numerals/__init__.py": base_text(row, "numerals/__init__.py") + RESTARTS})
    task = Task(task_id=ROMAN, prompt="", data={k: v for k, v in row.items() if k not in ("dataset", "checkout")})
    result = RolloutResult(rollout_id="r", task_id=ROMAN, status="completed", exit_reason="submitted", submission=patch)
    reward = asyncio.run(verifier(kind, row, instance_images, tmp_path / "ws").verify(task, result))
    assert reward.value == 1.0, (reward.details["unresolved_reason"], reward.details["test_output"][-3000:])
    assert reward.details["canaries"] >= 2 and not reward.details["tampering"]
