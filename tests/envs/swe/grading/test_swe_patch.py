"""Paths a diff touches: git headers with spaces, quoting, renames, deletions, plain diff -u, hunk bodies."""

from __future__ import annotations

import subprocess

from envs.swe.diffs import diff_paths
from envs.swe.grading.patch import in_repo


def test_paths_of_a_real_git_diff(tmp_path):
    def git(*args):
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@x",
               "HOME": str(tmp_path)}
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for name in ("sp ace.txt", "t\u00e9st.py", "br[a].py", "gone.py", "mode.sh", "keep.py"):
        (tmp_path / name).write_text("line\n")
    git("add", "-A")
    git("commit", "-qm", "base")
    (tmp_path / "sp ace.txt").write_text("line\nmore\n")
    (tmp_path / "t\u00e9st.py").write_text("changed\n")
    git("mv", "br[a].py", "br b.py")
    (tmp_path / "gone.py").unlink()
    (tmp_path / "mode.sh").chmod(0o755)
    (tmp_path / "new dir").mkdir()
    (tmp_path / "new dir" / "new.py").write_text("")
    git("add", "-A")
    paths = diff_paths(git("diff", "--cached"))
    assert sorted(paths) == sorted(["br[a].py", "br b.py", "gone.py", "mode.sh", "new dir/new.py", "sp ace.txt",
                                    "t\u00e9st.py"])


def test_hunk_bodies_are_not_headers():
    diff = ("--- a/sql.txt\n+++ b/sql.txt\n@@ -1,2 +1,2 @@\n--- a/not/a/file\n+++ b/not/a/file\n context\n"
            "\\ No newline at end of file\n--- old/plain.c\t2020-01-01 00:00:00\n+++ new/plain.c\t2020-01-02 00:00:00\n"
            "@@ -1 +1 @@\n-x\n+y\n")
    assert diff_paths(diff) == ["sql.txt", "plain.c"]


def test_unsafe_and_null_paths_are_left_out():
    diff = "--- /dev/null\n+++ b/../outside.py\n@@ -0,0 +1 @@\n+x\n--- a/ok.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    assert diff_paths(diff) == ["ok.py"]
    assert in_repo("/testbed", "a/b.py") == "/testbed/a/b.py" and in_repo(".", "a.py") == "a.py"
