"""SWE rows are checked when the dataset loads: fields that would only fail at grading (twice, as
verifier_error) or reach a shell command are refused with the field named."""

import pytest

from envs.swe.env import check_grading_fields, check_row, diff_problem
from rollout.records import Task

DIFF = "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-a\n+b\n"


def row(**data):
    return Task(task_id="a__b-1", data={"base_commit": "0" * 40, "problem_statement": "fix", **data})


@pytest.mark.parametrize("commit", ["d16bfe05a744909de4b27f5875fe0d4ed41ce607", "HEAD", "v1.2.3", "HEAD~1",
                                    "origin/main", "abc123^", "main@{1}"])
def test_commits_and_refs_are_accepted(commit):
    check_row(row(base_commit=commit))


@pytest.mark.parametrize("commit", ["--output=/tmp/x", "-p", "a b", "a;rm -rf /", "$(id)", "HEAD..main", "`id`",
                                    "x.lock", "", 7])
def test_anything_else_in_base_commit_is_refused(commit):
    with pytest.raises(ValueError, match="base_commit"):
        check_row(row(base_commit=commit))


@pytest.mark.parametrize("patch, says", [("just words", "not a diff"),
                                         ("--- a/t.py\n+++ b/t.py\n", "without any change"),
                                         (["a list"], "must be a string")])
def test_a_test_patch_that_is_not_a_diff_is_refused(patch, says):
    with pytest.raises(ValueError, match=f"field test_patch: .*{says}"):
        check_grading_fields(row(test_patch=patch))


def test_diffs_and_empty_test_patches_pass():
    for patch in (DIFF, "", None, "diff --git a/x b/y\nsimilarity index 100%\nrename from x\nrename to y\n"):
        assert diff_problem(patch) is None
