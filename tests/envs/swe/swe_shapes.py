"""A tiny calculator repository and one row of each shape over it (SWE-bench 4.x, SWE-bench 5.x, SWE-smith, SWE-Gym),
with small local images for them built FROM the base image under the names each benchmark gives (no registry)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

OPS = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef sub(a, b):\n    return a + b\n"
FIXED = OPS.replace("return a - b", "return a + b", 1).replace("def sub(a, b):\n    return a + b",
                                                               "def sub(a, b):\n    return a - b")
HALF = OPS.replace("return a - b", "return a + b", 1)
TESTS = ("import pytest\n\nfrom calc.ops import mul\n\n\n@pytest.mark.parametrize('pair', ['two three', 'x'])\n"
         "def test_mul(pair):\n    assert mul(2, 3) == 6\n\n\ndef test_mul_zero():\n    assert mul(0, 5) == 0\n")
NEW_TESTS = TESTS.replace("from calc.ops import mul", "from calc.ops import add, mul") + (
    "\n\ndef test_add():\n    assert add(2, 3) == 5\n")
SUB_TESTS = "from calc.ops import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
F2P = ["tests/test_ops.py::test_add", "tests/test_sub.py::test_sub"]
P2P = ["tests/test_ops.py::test_mul[two", "tests/test_ops.py::test_mul[x]", "tests/test_ops.py::test_mul_zero"]
TEST_FILES = "tests/test_ops.py tests/test_sub.py"
PYTEST = "PYTHONDONTWRITEBYTECODE=1 pytest -rA -p no:cacheprovider"

V5_IMAGE = "swebench/sweb.eval.x86_64.calc_1776_calc-5:rollout-farm-test"
SMITH_SNAPSHOT = "calc__calc.1a2b3c4d"
SMITH_ID = f"{SMITH_SNAPSHOT}.func_pm_op_swap__k3x9"
GYM_ID = "iterative__dvc-90001"  # a SWE-Gym repository's name: its image name and test command are SWE-Gym's
LABEL = "rollout-farm.test=swe-v5-rows"


def git(cwd, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def write(root: Path, files: dict[str, str | None]) -> None:
    for path, text in files.items():
        target = root / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)


def commit(repo: Path, files: dict[str, str | None], message: str) -> str:
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


def diff_of(repo: Path, commit_ish: str, work: Path, edits: dict[str, str | None]) -> str:
    """The ``git diff`` an agent would submit after making ``edits`` (None deletes) at ``commit_ish``."""
    git(None, "clone", "-q", str(repo), str(work))
    git(work, "checkout", "-q", commit_ish)
    write(work, edits)
    git(work, "add", "-A")
    return git(work, "diff", "--cached")


def v5_script(base: str, test_patch: str, command: str = f"{PYTEST} {TEST_FILES}") -> str:
    """An eval script of the shape SWE-bench's rows carry (written here as data)."""
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git config --global --add safe.directory /testbed",
        "git status", f"git -c core.fileMode=false diff {base}", f"git checkout {base} {TEST_FILES}",
        f"git apply -v - <<'EOF_114329324912'\n{test_patch}\nEOF_114329324912",
        ": '>>>>> Start Test Output'", command, ": '>>>>> End Test Output'", f"git checkout {base} {TEST_FILES}",
    ]) + "\n"


def make_rows(root: Path) -> dict:
    """The repository, its SWE-smith variant, and a row of each shape (plus gold and half patches per shape)."""
    repo = root / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = commit(repo, {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS,
                         "conftest.py": "# the repository's root on sys.path for `pytest`\n"}, "base")
    test_patch = diff_of(repo, base, root / "tp", {"tests/test_ops.py": NEW_TESTS, "tests/test_sub.py": SUB_TESTS})
    gold = diff_of(repo, base, root / "gold", {"calc/ops.py": FIXED})
    half = diff_of(repo, base, root / "half", {"calc/ops.py": HALF})
    common = {"base_commit": base, "problem_statement": "add and sub are wrong", "test_patch": test_patch,
              "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P, "version": "3.0"}
    v4 = {**common, "instance_id": "calc__calc-4", "repo": "example/calc", "repo_path": str(repo),
          "test_cmd": f"{PYTEST} {TEST_FILES}"}
    # 5.x's parser cuts ids at whitespace, and finds an id cut inside its parameters by its prefix.
    v5 = {**common, "instance_id": "calc__calc-5", "repo": "example/calc", "image": V5_IMAGE,
          "PASS_TO_PASS": ["tests/test_ops.py::test_mul[tw", *P2P[1:]],
          "eval_script": v5_script(base, test_patch), "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    gym = {**common, "instance_id": GYM_ID, "repo": "iterative/dvc"}
    # SWE-smith: main is the clean code with every test; the instance branch adds the bug, then removes the files
    # of its failing tests. Its gold patch is the bug undone.
    smith = root / "smith"
    git(None, "clone", "-q", str(repo), str(smith))
    clean = commit(smith, {"calc/ops.py": FIXED, "tests/test_ops.py": NEW_TESTS, "tests/test_sub.py": SUB_TESTS},
                   "clean")
    git(smith, "checkout", "-q", "-b", SMITH_ID)
    commit(smith, {"calc/ops.py": OPS}, "bug")
    commit(smith, {"tests/test_sub.py": None}, "remove F2P tests")
    git(smith, "checkout", "-q", "main")
    smith_row = {"instance_id": SMITH_ID, "repo": f"swesmith/{SMITH_SNAPSHOT}", "problem_statement": "sub is wrong",
                 "patch": git(smith, "diff", clean, f"{SMITH_ID}~1"), "FAIL_TO_PASS": ["tests/test_sub.py::test_sub",
                 "tests/test_ops.py::test_add"], "PASS_TO_PASS": ["tests/test_ops.py::test_mul_zero"]}
    smith_gold = diff_of(smith, SMITH_ID, root / "smith-gold", {"calc/ops.py": FIXED})
    smith_half = diff_of(smith, SMITH_ID, root / "smith-half", {"calc/ops.py": HALF})
    return {"repo": repo, "smith_repo": smith, "base": base, "rows": {"v4": v4, "v5": v5, "gym": gym,
            "smith": smith_row}, "gold": {"v4": gold, "v5": gold, "gym": gold, "smith": smith_gold},
            "half": {"v4": half, "v5": half, "gym": half, "smith": smith_half}}


def build_image(base_image: str, repo: Path, tag: str, where: Path, checkout: str | None = None) -> str:
    """``FROM base_image`` with ``repo`` (every branch) at /testbed, at ``checkout`` (default: as cloned)."""
    context = where / f"ctx-{abs(hash(tag))}"
    git(None, "clone", "-q", "--no-hardlinks", str(repo), str(context / "testbed"))
    for branch in git(context / "testbed", "branch", "-r", "--format=%(refname:lstrip=3)").split():
        if branch != "HEAD" and not git(context / "testbed", "branch", "--list", branch).strip():
            git(context / "testbed", "branch", "-q", branch, f"origin/{branch}")
    if checkout:
        git(context / "testbed", "checkout", "-q", checkout)
    (context / "Dockerfile").write_text("\n".join([
        f"FROM {base_image}", f"LABEL {LABEL}", "COPY testbed /testbed", "WORKDIR /testbed",
        "RUN git config --system user.name t && git config --system user.email t@example.invalid"
        " && git config --system --add safe.directory '*'"]) + "\n")
    done = subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(context)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.rmtree(context, ignore_errors=True)
    return tag


def remove_images(tags: list[str]) -> None:
    subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)


def dataset(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
