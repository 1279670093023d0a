"""SWE grading end to end on a tiny real repository: fresh local workspaces (one container), real git and pytest."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.runtimes.local import LocalRuntime
from envs.swe.grading.eval_script import MARK
from envs.swe.grading.grade import APPLY_LADDER, grade
from envs.swe.verifier import SweVerifier
from rollout.data.dataset import load_tasks
from rollout.errors import VerifierError
from rollout.records import RolloutResult

OPS = '''"""Small arithmetic."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b


def neg(a):
    return -a


def sub(a, b):
    return a + b
'''
TESTS = '''import pytest

from calc.ops import mul


@pytest.mark.parametrize("pair", ["two three", "[x] y"])
def test_mul(pair):
    assert mul(2, 3) == 6


def test_mul_zero():
    assert mul(0, 5) == 0
'''
NEW_TESTS = TESTS.replace("from calc.ops import mul", "from calc.ops import add, mul") + '''

def test_add():
    assert add(2, 3) == 5


@pytest.mark.parametrize("case", ["one plus two"])
def test_add_cases(case):
    assert add(1, 2) == 3
'''
SUB_TESTS = "from calc.ops import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
FIXED = OPS.replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b").replace(
    "def sub(a, b):\n    return a + b", "def sub(a, b):\n    return a - b")
TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 {python} -m pytest -rA -p no:cacheprovider tests"
F2P = ["tests/test_ops.py::test_add", "tests/test_ops.py::test_add_cases[one plus two]", "tests/test_sub.py::test_sub"]
# A whole id with spaces, and one cut at its space as datasets made by the harness hold them.
P2P = ["tests/test_ops.py::test_mul[two three]", "tests/test_ops.py::test_mul[[x]", "tests/test_ops.py::test_mul_zero"]


def git(cwd, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def diff_of(source: Path, work: Path, edits: dict[str, str | None]) -> str:
    """The ``git diff`` an agent would submit after making ``edits`` (None deletes) in its own clone."""
    git(None, "clone", "-q", str(source), str(work))
    for path, text in edits.items():
        target = work / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    git(work, "add", "-A")
    return git(work, "diff", "--cached")


@pytest.fixture(scope="module")
def instance(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("instance")
    repo = root / "repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(OPS)
    (repo / "tests" / "test_ops.py").write_text(TESTS)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "bundle", "create", "-q", str(root / "repo.bundle"), "--all")
    return {
        "instance_id": "calc__calc-1", "repo": "example/calc", "version": "1.0", "base_commit": base,
        "problem_statement": "add and sub are wrong",
        "patch": diff_of(repo, root / "gold", {"calc/ops.py": FIXED}),
        "test_patch": diff_of(repo, root / "tests", {"tests/test_ops.py": NEW_TESTS, "tests/test_sub.py": SUB_TESTS}),
        "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P, "test_cmd": TEST_CMD.format(python=shlex.quote(sys.executable)),
        "repo_path": str(repo), "bundle": (root / "repo.bundle").read_bytes(),
    }


class ClonedRepo:
    """A runtime whose start() also clones the instance at base_commit into ``repo_dir``: what an instance
    image gives the grader, made here from a plain workspace or the base image."""

    def __init__(self, inner, bundle: bytes, commit: str, repo_dir: str, bundle_path: str):
        self.inner, self.bundle, self.commit = inner, bundle, commit
        self.repo_dir, self.bundle_path = repo_dir, bundle_path

    async def start(self) -> None:
        await self.inner.start()
        await self.inner.write_file(self.bundle_path, self.bundle)
        done = await self.inner.exec(f"git clone -q {self.bundle_path} {self.repo_dir} && "
                                     f"git -C {self.repo_dir} checkout -q {self.commit}", timeout=120)
        assert done.returncode == 0, done.output

    async def exec(self, command, timeout=None, cwd=None, env=None, stdin=None):
        return await self.inner.exec(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin)

    async def write_file(self, path, data):
        await self.inner.write_file(path, data)

    async def read_file(self, path):
        return await self.inner.read_file(path)

    async def close(self) -> None:
        await self.inner.close()


def local_factory(instance, root: Path):
    def make():
        inner = LocalRuntime({"root": str(root), "timeout": 60}, trusted_model=True)
        return ClonedRepo(inner, instance["bundle"], instance["base_commit"], "repo", "src.bundle")
    return make


def run_grade(instance, patch, tmp_path, **kwargs):
    """Grade in fresh local workspaces under tmp_path; every workspace must be gone afterwards."""
    root = tmp_path / "workspaces"
    try:
        return asyncio.run(grade(instance, patch, local_factory(instance, root), repo_dir="repo", **kwargs))
    finally:
        assert not root.exists() or not list(root.iterdir()), "the grading runtime was not closed"


def test_gold_patch_resolves(instance, tmp_path):
    graded = run_grade(instance, instance["patch"], tmp_path)
    assert graded.resolved and graded.reward == 1.0
    assert graded.patch_exists and not graded.patch_is_None and graded.patch_successfully_applied
    assert graded.apply_method == APPLY_LADDER[0] and not graded.timed_out
    assert graded.tests_status["FAIL_TO_PASS"] == {"success": F2P, "failure": []}
    assert graded.tests_status["PASS_TO_PASS"] == {"success": P2P, "failure": []}
    assert graded.test_statuses["tests/test_ops.py::test_add_cases[one plus two]"] == "PASSED"
    assert "short test summary info" in graded.test_output and graded.test_returncode == 0
    assert set(graded.durations) >= {"start", "apply", "reset", "tests", "total"}


def test_no_patch_is_unresolved_without_a_runtime(instance):
    def no_runtime():
        raise AssertionError("an empty patch needs no runtime")

    for patch, is_none in ((None, True), ("", False), ("  \n", False)):
        graded = asyncio.run(grade(instance, patch, no_runtime))
        assert (graded.resolved, graded.reward, graded.patch_is_None) == (False, 0.0, is_none)
        assert not graded.patch_exists and not graded.patch_successfully_applied


def test_gold_patch_missing_a_hunk_is_unresolved(instance, tmp_path):
    half = OPS.replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b")
    patch = diff_of(Path(instance["repo_path"]), tmp_path / "agent", {"calc/ops.py": half})
    graded = run_grade(instance, patch, tmp_path)
    assert graded.patch_successfully_applied and not graded.resolved and graded.reward == 0.0
    assert graded.tests_status["FAIL_TO_PASS"] == {"success": F2P[:2], "failure": F2P[2:]}


@pytest.mark.parametrize("tamper", ["rewrite", "delete"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "not fixed"])
def test_test_files_the_agent_touched_do_not_count(instance, tmp_path, fixed, tamper):
    """The agent rewrote (or deleted) the test file and pre-created the one the test patch adds, with
    tests that always pass: the grader restores them, so only the fix decides."""
    cheat = "def test_add():\n    pass\n\n\ndef test_mul_zero():\n    pass\n"
    edits = {"tests/test_ops.py": cheat if tamper == "rewrite" else None,
             "tests/test_sub.py": "def test_sub():\n    pass\n", "calc/ops.py": FIXED if fixed else OPS + "\n# tried\n"}
    patch = diff_of(Path(instance["repo_path"]), tmp_path / "agent", edits)
    graded = run_grade(instance, patch, tmp_path)
    assert graded.patch_successfully_applied
    assert graded.resolved is fixed
    assert graded.test_statuses["tests/test_sub.py::test_sub"] == ("PASSED" if fixed else "FAILED")


def test_a_hanging_test_run_times_out_unresolved(instance, tmp_path):
    hang = FIXED.replace("def add(a, b):\n    return a + b", "def add(a, b):\n    while True:\n        pass")
    patch = diff_of(Path(instance["repo_path"]), tmp_path / "agent", {"calc/ops.py": hang})
    began = time.monotonic()
    graded = run_grade(instance, patch, tmp_path, eval_timeout=3)
    assert time.monotonic() - began < 3 + 10
    assert graded.timed_out and not graded.resolved and graded.reward == 0.0
    assert graded.patch_successfully_applied and "Timeout error: 3 seconds exceeded." in graded.test_output


def test_lenient_ladder_applies_a_fuzzy_patch(instance, tmp_path):
    """One file's hunk needs fuzz (a context line differs), another's is exact: git apply refuses it,
    --reject applies half, and `patch` must then start from the untouched tree to resolve."""
    fuzzy = instance["patch"].replace("\n def mul(a, b):\n", "\n def mul(a, b):  # context drifted\n")
    fuzzy += diff_of(Path(instance["repo_path"]), tmp_path / "agent", {"calc/__init__.py": '"""Calc."""\n'})
    graded = run_grade(instance, fuzzy, tmp_path)
    assert graded.apply_method == APPLY_LADDER[2], graded.apply_output
    assert graded.resolved
    assert not [k for k in graded.test_statuses if ".rej" in k or ".orig" in k]


def test_a_patch_that_does_not_apply_is_unresolved(instance, tmp_path):
    broken = instance["patch"].replace("-    return a - b", "-    return a * b * c")
    broken = broken.replace("-    return a + b", "-    return nothing_like_this")
    graded = run_grade(instance, broken, tmp_path)
    assert not graded.patch_successfully_applied and graded.apply_method is None and not graded.resolved
    assert all(f"$ {command}" in graded.apply_output for command in APPLY_LADDER)
    assert graded.tests_status == {} and graded.test_output == ""


def test_patch_without_trailing_newline_applies(instance, tmp_path):
    graded = run_grade(instance, instance["patch"].rstrip("\n"), tmp_path)
    assert graded.apply_method == APPLY_LADDER[0] and graded.resolved


def test_json_encoded_test_lists(instance, tmp_path):
    row = {**instance, "FAIL_TO_PASS": json.dumps(F2P), "PASS_TO_PASS": json.dumps(P2P)}
    assert run_grade(row, instance["patch"], tmp_path).resolved


def test_dataset_problems_are_verifier_errors(instance, tmp_path):
    wrong = instance["test_patch"].replace("-from calc.ops import mul", "-import x")
    bad_test_patch = {**instance, "test_patch": wrong}
    with pytest.raises(VerifierError, match="test patch does not apply"):
        run_grade(bad_test_patch, instance["patch"], tmp_path)
    no_cmd = {k: v for k, v in instance.items() if k != "test_cmd"}
    with pytest.raises(VerifierError, match="test_cmd"):
        run_grade(no_cmd, instance["patch"], tmp_path)
    with pytest.raises(VerifierError, match="FAIL_TO_PASS"):
        run_grade({**instance, "FAIL_TO_PASS": "not json"}, instance["patch"], tmp_path)


def test_verifier_grades_a_flat_dataset_row(instance, tmp_path):
    row = {k: v for k, v in instance.items() if k != "bundle"}
    (tmp_path / "data.jsonl").write_text(json.dumps(row) + "\n")
    [task] = load_tasks(tmp_path / "data.jsonl", allow_outside_paths=True)  # the repo lies beside, not below
    make = local_factory(instance, tmp_path / "workspaces")
    verifier = SweVerifier({"type": "swe", "repo_dir": "repo", "eval_timeout": 120}, runtime_factory=lambda t: make())
    for patch, value in ((instance["patch"], 1.0), (None, 0.0)):
        result = RolloutResult(rollout_id="r", task_id=task.task_id, status="completed", exit_reason="submitted",
                               submission=patch)
        reward = asyncio.run(verifier.verify(task, result))
        assert reward.value == value and reward.details["resolved"] is (value == 1.0)
        assert reward.details["instance_id"] == "calc__calc-1"


def test_docker_grading(instance, tmp_path, base_image):
    try:
        from envs.runtimes.docker.runtime import DockerRuntime
    except Exception as exc:  # noqa: BLE001 - written in parallel; this test waits for it
        pytest.skip(f"envs.runtimes.docker.runtime is not importable yet: {exc}")

    def make():
        inner = DockerRuntime({"image": base_image, "workdir": "/testbed"}, run_id="test-swe-grading",
                              rollout_id="grade")
        return ClonedRepo(inner, instance["bundle"], instance["base_commit"], "/testbed", "/tmp/src.bundle")

    instance = {**instance, "test_cmd": TEST_CMD.format(python="python3")}  # the image's interpreter
    gold = asyncio.run(grade(instance, instance["patch"], make, eval_timeout=120))
    assert gold.resolved and gold.apply_method == APPLY_LADDER[0], gold.test_output[-2000:]
    half = OPS.replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b")
    patch = diff_of(Path(instance["repo_path"]), tmp_path / "agent", {"calc/ops.py": half})
    graded = asyncio.run(grade(instance, patch, make, eval_timeout=120))
    assert graded.patch_successfully_applied and not graded.resolved
    assert graded.tests_status["FAIL_TO_PASS"]["failure"] == F2P[2:]


def test_report_agrees_with_the_swebench_harness(instance, tmp_path):
    """Our report.json equals what the harness's get_eval_report makes of the same test log, for a row whose
    test ids are in the harness's own (cut at whitespace) form."""
    try:
        from swebench.harness.grading import get_eval_report
    except Exception as exc:  # noqa: BLE001 - the optional package
        pytest.skip(f"swebench is not importable: {exc}")
    from types import SimpleNamespace

    row = {**instance, "FAIL_TO_PASS": [t.split()[0] for t in F2P], "PASS_TO_PASS": [t.split()[0] for t in P2P]}
    # Any repository the harness reads with its pytest parser will do: only its parser and test_cmd are looked up.
    spec = SimpleNamespace(instance_id=row["instance_id"], repo="pytest-dev/pytest", version="5.4",
                           FAIL_TO_PASS=row["FAIL_TO_PASS"], PASS_TO_PASS=row["PASS_TO_PASS"])
    half = OPS.replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b")
    patches = {"gold": instance["patch"], "half": diff_of(Path(instance["repo_path"]), tmp_path / "agent",
                                                          {"calc/ops.py": half})}
    for name, patch in patches.items():
        graded = run_grade(row, patch, tmp_path)
        log = tmp_path / f"{name}.txt"
        log.write_text(graded.test_output)
        pred = {"instance_id": row["instance_id"], "model_name_or_path": "m", "model_patch": patch}
        assert graded.report() == get_eval_report(spec, pred, str(log), include_tests_status=True), name
    assert graded.report()[row["instance_id"]]["resolved"] is False
    pred = {"instance_id": row["instance_id"], "model_name_or_path": "m", "model_patch": None}
    empty = asyncio.run(grade(row, None, lambda: None))
    assert empty.report() == get_eval_report(spec, pred, str(log), include_tests_status=True)


def test_rows_without_test_cmd_use_the_swebench_specs():
    try:
        import swebench.harness.constants  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - the optional package
        pytest.skip(f"swebench is not importable: {exc}")
    from envs.swe.rows.specs import swebench_plan

    test_patch = ("diff --git a/testing/test_x.py b/testing/test_x.py\n"
                  "--- a/testing/test_x.py\n+++ b/testing/test_x.py\n")
    setup, command, parse, fail_only = swebench_plan(
        {"repo": "pytest-dev/pytest", "version": "5.4", "test_patch": test_patch}, "pytest-dev__pytest-1")
    assert command == "pytest -rA testing/test_x.py" and not fail_only
    assert "conda activate testbed" in setup and "pip install -e ." in setup
    assert parse("PASSED testing/test_x.py::t\n") == {"testing/test_x.py::t": "PASSED"}
    for row in ({"repo": "pytest-dev/pytest", "version": "0.0"}, {"repo": "example/unknown", "version": "1"}):
        with pytest.raises(VerifierError, match="no spec"):
            swebench_plan({**row, "test_patch": test_patch}, "x")


class Recording:
    """Passes every call on to ``inner`` and notes what the grader asked of the runtime once started."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    async def start(self) -> None:
        await self.inner.start()

    async def exec(self, command, timeout=None, cwd=None, env=None, stdin=None):
        self.calls.append(("exec", command) if stdin is None else ("exec+stdin", command, stdin))
        return await self.inner.exec(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin)

    async def write_file(self, path, data):
        self.calls.append(("write_file", path))
        await self.inner.write_file(path, data)

    async def read_file(self, path):
        self.calls.append(("read_file", path))
        return await self.inner.read_file(path)

    async def close(self) -> None:
        await self.inner.close()


def recorded_grade(instance, patch, tmp_path, runtime_config=None):
    """Grade in a recorded local workspace: (the grade, the runtime calls of the grader)."""
    root, seen = tmp_path / "workspaces", []

    def make():
        inner = LocalRuntime({"root": str(root), "timeout": 60, **(runtime_config or {})}, trusted_model=True)
        seen.append(Recording(ClonedRepo(inner, instance["bundle"], instance["base_commit"], "repo", "src.bundle")))
        return seen[-1]

    graded = asyncio.run(grade(instance, patch, make, repo_dir="repo"))
    [runtime] = seen
    return graded, runtime.calls


def removed_scratch(calls) -> list[str]:
    """The paths the grader's last command removed, checked gone from this host (a local workspace's /tmp is ours)."""
    kind, command = calls[-1][:2]
    words = shlex.split(command)
    assert kind == "exec" and words[:3] == ["rm", "-rf", "--"], calls
    assert not any(os.path.exists(p) for p in words[3:]), words
    return words[3:]


def test_grading_is_one_command_and_cleans_a_host_workspace(instance, tmp_path):
    graded, calls = recorded_grade(instance, instance["patch"], tmp_path)
    assert graded.resolved and graded.apply_method == APPLY_LADDER[0]
    # The grading (the script on its stdin), then its scratch removed; the script is never on a command line
    # or in a file, and the command line is the same for every instance.
    assert [call[0] for call in calls] == ["exec+stdin", "exec"], calls
    _kind, loader, script = calls[0]
    assert MARK not in loader and len(loader) < 200 and MARK.encode() in script
    assert all(p.startswith("/tmp/rollout-grade-") for p in removed_scratch(calls))
    assert "read" not in graded.durations


def test_a_patch_too_big_for_a_command_line_goes_in_on_stdin(instance, tmp_path):
    words = "".join(f"word {n}\n" for n in range(12_000))  # ~110 KB: past any single argument's room
    patch = diff_of(Path(instance["repo_path"]), tmp_path / "agent", {"calc/ops.py": FIXED, "calc/words.txt": words})
    graded, calls = recorded_grade(instance, patch, tmp_path)
    assert graded.resolved and graded.patch_successfully_applied, graded.apply_output[-2000:]
    assert [call[0] for call in calls] == ["exec+stdin", "exec"], calls
    assert len(calls[0][2]) > 110_000 and removed_scratch(calls)


def test_patch_text_reaches_the_repository_unchanged(instance, tmp_path):
    """Quotes, percent signs, backslashes, shell syntax and non-ASCII text land in the file as the patch has them."""
    line = "# it's 100% done: \\n, \\\\, %s, $HOME, `x`, \"y\", \u2713\ttab"
    patch = diff_of(Path(instance["repo_path"]), tmp_path / "agent", {"calc/ops.py": FIXED + line + "\n"})
    row = {**instance, "test_cmd": f"grep -qxF {shlex.quote(line)} calc/ops.py && {instance['test_cmd']}"}
    graded = run_grade(row, patch, tmp_path)
    assert graded.resolved and graded.apply_method == APPLY_LADDER[0], graded.test_output[-2000:]


def test_a_log_past_the_output_cap_is_read_back(instance, tmp_path):
    """The tests print far more than the runtime passes back, their summary last: the grader reads the log file."""
    noisy = {**instance, "test_cmd": f"seq 1 60000; {instance['test_cmd']}"}
    graded, calls = recorded_grade(noisy, instance["patch"], tmp_path, {"max_output_bytes": 64 * 1024})
    assert graded.resolved, graded.test_output[-2000:]
    assert [call[0] for call in calls] == ["exec+stdin", "read_file", "exec"], calls
    assert "60000\n" in graded.test_output and "read" in graded.durations
    removed_scratch(calls)


class HookedCheckout(ClonedRepo):
    """The instance's clone with a post-checkout hook that hangs (the grader's git commands run no hook)."""

    async def start(self) -> None:
        await super().start()
        hook = f"{self.repo_dir}/.git/hooks/post-checkout"
        done = await self.inner.exec(f"printf '#!/bin/sh\\nsleep 60\\n' > {hook} && chmod +x {hook}", timeout=30)
        assert done.returncode == 0, done.output


class SlowCheckout(ClonedRepo):
    """The instance's clone with a smudge filter that hangs on every file: resetting the test files never ends."""

    async def start(self) -> None:
        await super().start()
        repo = self.repo_dir
        done = await self.inner.exec(f"git -C {repo} config filter.slow.smudge 'sleep 60; cat' && "
                                     f"printf '* filter=slow\\n' > {repo}/.git/info/attributes", timeout=30)
        assert done.returncode == 0, done.output


def test_no_hook_of_the_repository_runs_in_grading(instance, tmp_path):
    root = tmp_path / "workspaces"

    def make():
        inner = LocalRuntime({"root": str(root), "timeout": 60}, trusted_model=True)
        return HookedCheckout(inner, instance["bundle"], instance["base_commit"], "repo", "src.bundle")

    graded = asyncio.run(grade(instance, instance["patch"], make, repo_dir="repo", setup_timeout=20))
    assert graded.resolved, graded.unresolved_reason
    assert graded.durations["total"] < 20  # the hanging hook never ran


def test_a_preparation_step_past_setup_timeout_is_a_verifier_error(instance, tmp_path):
    root = tmp_path / "workspaces"

    def make():
        inner = LocalRuntime({"root": str(root), "timeout": 60}, trusted_model=True)
        return SlowCheckout(inner, instance["bundle"], instance["base_commit"], "repo", "src.bundle")

    began = time.monotonic()
    with pytest.raises(VerifierError, match="step '(apply1|reset)' took more than 0.5s"):
        asyncio.run(grade(instance, instance["patch"], make, repo_dir="repo", setup_timeout=0.5))
    assert time.monotonic() - began < 30  # the filter was stopped, not waited for
    assert not list(root.iterdir())


def test_docker_grading_is_one_exec(instance, base_image):
    from envs.runtimes.docker.runtime import DockerRuntime

    seen = []

    def make():
        inner = DockerRuntime({"image": base_image, "workdir": "/testbed"}, run_id="test-swe-grading",
                              rollout_id="grade-calls")
        seen.append(Recording(ClonedRepo(inner, instance["bundle"], instance["base_commit"], "/testbed",
                                         "/tmp/src.bundle")))
        return seen[-1]

    instance = {**instance, "test_cmd": TEST_CMD.format(python="python3")}
    graded = asyncio.run(grade(instance, instance["patch"], make, eval_timeout=120))
    assert graded.resolved, graded.test_output[-2000:]
    # One exec, the script on its stdin; the container's /tmp goes with the container.
    assert [call[0] for call in seen[0].calls] == ["exec+stdin"]


def test_strict_grading_refuses_patches_touching_tests(instance, tmp_path):
    """Strict mode: the gold patch still resolves; the same fix plus any edit of a test file or of pytest's
    configuration scores 0 with the reason, whatever the tests would say."""
    assert run_grade(instance, instance["patch"], tmp_path, strict=True).resolved
    repo = Path(instance["repo_path"])
    for n, extra in enumerate([{"tests/test_ops.py": TESTS + "\n# touched\n"}, {"conftest.py": ""},
                               {"calc/test_helpers.py": "X = 1\n"}, {"pytest.ini": "[pytest]\n"}]):
        patch = diff_of(repo, tmp_path / f"agent{n}", {"calc/ops.py": FIXED, **extra})
        graded = run_grade(instance, patch, tmp_path, strict=True)
        assert not graded.resolved and graded.reward == 0.0
        assert graded.unresolved_reason.startswith("strict grading") and next(iter(extra)) in graded.unresolved_reason
        assert run_grade(instance, patch, tmp_path).resolved  # the default mode restores them and grades the fix


def test_only_the_pytest_section_of_a_config_file_is_restored(instance, tmp_path):
    """A patch that also edits setup.cfg: its other sections stay as patched (the tests see them), its pytest
    section goes back to base (here: none), so an option deselecting the failing tests has no effect."""
    ids = " ".join(f"--deselect={t.split()[0]}" for t in F2P)
    cfg = f"[calc]\nflavour = patched\n\n[tool:pytest]\naddopts = {ids}\n"
    row = {**instance, "test_cmd": f"cat setup.cfg; {instance['test_cmd']}"}
    repo = Path(instance["repo_path"])
    fixed = diff_of(repo, tmp_path / "a", {"calc/ops.py": FIXED, "setup.cfg": cfg})
    graded = run_grade(row, fixed, tmp_path)
    assert graded.resolved and graded.restored == ["setup.cfg"], graded.test_output[-2000:]
    assert "[calc]\nflavour = patched\n" in graded.test_output and "tool:pytest" not in graded.test_output
    unfixed = diff_of(repo, tmp_path / "b", {"setup.cfg": cfg})
    graded = run_grade(row, unfixed, tmp_path)
    assert not graded.resolved and graded.tests_status["FAIL_TO_PASS"]["failure"] == F2P
    assert "restored to base_commit" in graded.unresolved_reason
