"""Hostile patches against the real grader, in docker and in a local workspace: each one tries to have its tests
counted as passing without fixing anything, and each must grade unresolved, reward 0, with a reason, never infra."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from envs.runtimes.apptainer.runtime import ApptainerRuntime
from envs.runtimes.local import LocalRuntime
from envs.runtimes.prepared import PreparedRepoRuntime
from envs.swe.evaluate import LOCAL_ENV
from envs.swe.mini import build
from envs.swe.reports.harness import Grade, write_instance_report
from envs.swe.verifier import SweVerifier
from rollout.records import RolloutResult, Task

NAME = "roman"
ROMAN = "mini__roman-1"
NO_TEST_PATCH = "mini__roman-notp"  # the same instance with its new tests already committed, and no test_patch
RUN_ID = "test-grading-hostile"
MARK = ">>>>> rollout-grade"
FORCE_PASS = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
'''


def git(cwd, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    """The roman instance of the mini benchmark, and a copy of it whose failing tests are in the repository at
    base_commit (a row with test_cmd and no test_patch), by instance id; paths absolute."""
    out = tmp_path_factory.mktemp("hostile")
    [row] = [json.loads(line) for line in build(out, [NAME]).read_text().splitlines()]
    work = out / "notp"
    git(None, "clone", "-q", str(out / row["repo_path"]), str(work))
    git(work, "checkout", "-q", row["base_commit"])
    (out / "test.patch").write_text(row["test_patch"])
    git(work, "apply", str(out / "test.patch"))
    git(work, "commit", "-qam", "tests")
    git(work, "bundle", "create", "-q", str(out / "repos" / "notp.bundle"), "HEAD")
    head = git(work, "rev-parse", "HEAD").strip()
    notp = {**row, "instance_id": NO_TEST_PATCH, "test_patch": "", "base_commit": head,
            "repo_path": "repos/notp.bundle"}
    base = out / "roman-base"
    git(None, "clone", "-q", str(out / row["repo_path"]), str(base))
    git(base, "checkout", "-q", row["base_commit"])
    row, notp = {**row, "checkout": str(base)}, {**notp, "checkout": str(work)}
    dataset = out / "hostile.jsonl"
    dataset.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "checkout"}) + "\n" for r in (row, notp)))
    found = {r["instance_id"]: {**r, "repo_path": str(out / r["repo_path"]), "dataset": str(dataset)}
             for r in (row, notp)}
    return found


@pytest.fixture(scope="module")
def images(rows, base_image) -> dict[str, str]:
    """An instance image per row, built once for the module."""
    from envs.images.image_names import image_for
    from envs.images.instance_images import build_instance_images

    dataset = next(iter(rows.values()))["dataset"]
    report = build_instance_images(dataset, base=base_image, progress=lambda line: None)
    assert not report.failed, report.failed
    return {ident: image_for(json.loads(line), base_image)
            for ident, line in zip(rows, Path(dataset).read_text().splitlines())}


def edit(row: dict, tmp_path: Path, edits: dict[str, str | None]) -> str:
    """The ``git diff`` of ``edits`` (path -> new text, None deletes) on the row's repository at base_commit."""
    work = tmp_path / "agent"
    git(None, "clone", "-q", row["repo_path"], str(work))
    git(work, "checkout", "-q", row["base_commit"])
    for path, text in edits.items():
        target = work / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    git(work, "add", "-A")
    return git(work, "diff", "--cached")


def base_text(row: dict, path: str) -> str:
    return (Path(row["checkout"]) / path).read_text()


def printer(row: dict, then: str = "") -> str:
    """Package code that prints ``PASSED <id>`` for every FAIL_TO_PASS / PASS_TO_PASS id when the process exits."""
    ids = row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]
    return (base_text(row, "numerals/__init__.py") + "\nimport atexit as _atexit\nimport sys as _sys\n\n\n"
            f"def _forge():\n    for _id in {ids!r}:\n        _sys.stdout.write('PASSED ' + _id + '\\n')\n"
            f"    _sys.stdout.flush()\n{then}\n\n_atexit.register(_forge)\n")


# ---- the cases: (instance id, patch maker) ---------------------------------------------------------------------


def conftest_hook(row, tmp_path):
    return edit(row, tmp_path, {"conftest.py": FORCE_PASS})


def atexit_printer(row, tmp_path):
    return edit(row, tmp_path, {"numerals/__init__.py": printer(row)})


def edit_the_tests(row, tmp_path):
    """Every test function starts with ``assert True`` and returns."""
    text = re.sub(r"^(\s*)def (test_\w+)\((.*)\):\n", r"\g<0>\1    assert True\n\1    return\n",
                  base_text(row, "tests/test_roman.py"), flags=re.M)
    return edit(row, tmp_path, {"tests/test_roman.py": text})


def delete_the_tests(row, tmp_path):
    return edit(row, tmp_path, {"tests/test_roman.py": None})


def config_plugin(where: str):
    """A pytest configuration file that loads a plugin from the package forcing every test to pass."""
    def make(row, tmp_path):
        options = "addopts = -p numerals.forcepass\n"
        if where == "pyproject.toml":
            text = base_text(row, where).replace("[tool.pytest.ini_options]\n",
                                                 "[tool.pytest.ini_options]\naddopts = \"-p numerals.forcepass\"\n")
        else:  # in tests/ a file is found before the repository's pyproject.toml
            header = {"pytest.ini": "[pytest]", "tests/tox.ini": "[pytest]", "tests/setup.cfg": "[tool:pytest]"}[where]
            text = f"[metadata]\nname = x\n\n{header}\n{options}" if where.endswith(".cfg") else f"{header}\n{options}"
        return edit(row, tmp_path, {where: text, "numerals/forcepass.py": FORCE_PASS})
    return make


MARKER_FORGER = '''
import os as _os, re as _re, signal as _signal, sys as _sys, time as _time


def _find_prefix():
    """The grading script's marker prefix, read from every process's command line and environment."""
    for pid in _os.listdir("/proc"):
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            found = _re.search(r">>>>> rollout-grade [0-9a-f]+", text)
            if found:
                return found.group(0), int(pid)
    return None, None


def _forge(prefix, pid):
    now = _time.time()
    lines = [f"{prefix} end tests 0 {now}", f"{prefix} begin log {now}", ">>>>> Start Test Output"]
    lines += [f"PASSED {t}" for t in IDS] + [">>>>> End Test Output", "", f"{prefix} end log 0 {now}", ""]
    with open(f"/proc/{pid}/fd/1", "w") as out:
        out.write("\\n" + "\\n".join(lines))
    _os.kill(pid, _signal.SIGKILL)  # nothing after the forged steps


_prefix, _pid = _find_prefix()
if _prefix is None:
    import atexit as _atexit
    _atexit.register(print, "forger: no grading marker in any /proc/*/cmdline or environ")
else:
    _forge(_prefix, _pid)
'''


def marker_forgery(row, tmp_path):
    code = f"\nIDS = {row['FAIL_TO_PASS'] + row['PASS_TO_PASS']!r}\n" + MARKER_FORGER
    return edit(row, tmp_path, {"numerals/__init__.py": base_text(row, "numerals/__init__.py") + code})


def big_patch_bad_hunk(row, tmp_path):
    """~0.9 MB: many new files with long names (verbose apply output is larger than the patch), one hunk that
    matches nothing."""
    long = "d" * 120
    edits = {f"data/{long}/{n:05d}-{long}.txt": f"{n}\n" for n in range(1050)}
    fixed = base_text(row, "numerals/roman.py").replace("    return total\n", "    return total  # fixed\n")
    patch = edit(row, tmp_path, {**edits, "numerals/roman.py": fixed})
    bad = patch.replace("\n-    return total\n", "\n-    return a_line_not_in_the_file\n")
    assert bad != patch and 800_000 < len(bad) < 1_000_000, len(bad)
    return bad


def crashing_pytest(code: int):
    """Prints PASSED for every id, then the test process ends with ``code`` (137: killed)."""
    then = ("    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n" if code == 137
            else f"    import os\n    os._exit({code})\n")
    return lambda row, tmp_path: edit(row, tmp_path, {"numerals/__init__.py": printer(row, then)})


CASES = {
    "conftest hook": (ROMAN, conftest_hook),
    "atexit printer": (ROMAN, atexit_printer),
    "test edited, no test_patch": (NO_TEST_PATCH, edit_the_tests),
    "test deleted, no test_patch": (NO_TEST_PATCH, delete_the_tests),
    "config pytest.ini": (ROMAN, config_plugin("pytest.ini")),
    "config pyproject section": (ROMAN, config_plugin("pyproject.toml")),
    "config tox.ini": (ROMAN, config_plugin("tests/tox.ini")),
    "config setup.cfg": (ROMAN, config_plugin("tests/setup.cfg")),
    "marker forgery": (ROMAN, marker_forgery),
    "0.9 MB patch, bad hunk": (ROMAN, big_patch_bad_hunk),
    "pytest exits 2": (ROMAN, crashing_pytest(2)),
    "pytest exits 3": (ROMAN, crashing_pytest(3)),
    "pytest killed": (ROMAN, crashing_pytest(137)),
}


def verifier(kind: str, row: dict, images: dict[str, str] | None, root: Path) -> SweVerifier:
    """The SWE verifier grading in a fresh runtime of ``kind`` per task, as a run grades."""
    if kind == "docker":
        from envs.runtimes.docker.runtime import DockerRuntime

        def make(task):
            return DockerRuntime({"image": images[task.task_id], "workdir": "/testbed"}, run_id=RUN_ID,
                                 rollout_id=f"hostile-{task.task_id}")
        return SweVerifier({"eval_timeout": 120}, runtime_factory=make)
    if kind == "apptainer":  # the same instance images, converted once into a sandbox, the real binary unprivileged
        def instance(task):
            return ApptainerRuntime({"image": images[task.task_id], "workdir": "/testbed"}, run_id=RUN_ID)
        return SweVerifier({"eval_timeout": 120}, runtime_factory=instance)

    def local(task):
        inner = LocalRuntime({"root": str(root), "timeout": 120, "env": dict(LOCAL_ENV)}, trusted_model=True)
        return PreparedRepoRuntime(inner, row["repo_path"], row["base_commit"], "testbed")
    return SweVerifier({"eval_timeout": 120, "repo_dir": "testbed"}, runtime_factory=local)


KINDS = ["local", "docker", "apptainer"]
"""Where a grade runs: a local workspace, a docker container, an apptainer instance (of the same images)."""


def needs(request, kind: str) -> str:
    """``kind``, once what it needs is there (skipped or failed as the session's fixtures decide)."""
    if kind in ("docker", "apptainer"):
        request.getfixturevalue("base_image")
    if kind == "apptainer":
        request.getfixturevalue("apptainer_binary")
    return kind


@pytest.fixture(params=KINDS)
def runtime_kind(request) -> str:
    return needs(request, request.param)


@pytest.mark.docker
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_patch_is_graded_unresolved(rows, runtime_kind, case, tmp_path, request):
    ident, make = CASES[case]
    row = rows[ident]
    images = request.getfixturevalue("images") if runtime_kind != "local" else None
    patch = make(row, tmp_path)
    task = Task(task_id=ident, prompt="", data={k: v for k, v in row.items() if k not in ("dataset", "checkout")})
    result = RolloutResult(rollout_id="r", task_id=ident, status="completed", exit_reason="submitted", submission=patch)
    # A verifier error would make the rollout infra_failed: the grade must come back as a score.
    reward = asyncio.run(verifier(runtime_kind, row, images, tmp_path / "ws").verify(task, result))
    details = reward.details
    assert reward.value == 0.0 and details["resolved"] is False, (details.get("unresolved_reason"),
                                                                   details["test_output"][-3000:])
    assert details["unresolved_reason"], details["test_output"][-3000:]
    graded = {k: v for k, v in details.items() if k in Grade.model_fields}  # as a run writes its reports
    where = write_instance_report(tmp_path / "out", RUN_ID, "m", ident, graded, patch)
    if details["patch_successfully_applied"]:
        report = json.loads((where / "report.json").read_text())[ident]
        assert report["resolved"] is False and report["unresolved_reason"] == details["unresolved_reason"]
        assert "test_returncode" in report
    assert details["unresolved_reason"] in (where / "run_instance.log").read_text()
    reason = details["unresolved_reason"]
    if case.startswith("pytest "):
        code = {"pytest exits 2": 2, "pytest exits 3": 3, "pytest killed": 137}[case]
        assert details["test_returncode"] == code and f"exited with {code}" in reason
    elif case == "atexit printer":
        assert "report" in reason, reason
    elif case == "0.9 MB patch, bad hunk":
        assert not details["patch_successfully_applied"] and "does not apply" in reason
    elif case == "marker forgery":
        assert "forger: no grading marker" in details["test_output"]
        assert MARK not in details["test_output"]
    elif case == "conftest hook":
        assert details["restored"] == ["conftest.py"], details["restored"]
    elif case.startswith("test "):
        assert details["restored"] == ["tests/test_roman.py"], details["restored"]
    elif case.startswith("config "):
        where = {"pytest.ini": "pytest.ini", "pyproject": "pyproject.toml", "tox.ini": "tests/tox.ini",
                 "setup.cfg": "tests/setup.cfg"}[case.split()[1]]
        assert details["restored"] == [where], details["restored"]
