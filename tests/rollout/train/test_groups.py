"""Groups of n samples and the group failure policies a trainer picks."""

import pytest
from pydantic import ValidationError

from rollout.errors import ExitReason
from rollout.records import RolloutResult
from rollout.train.groups import Batch, GroupPolicy, apply_policy, group_results


def member(task, sample, reward=None, failed=False):
    return RolloutResult(rollout_id=f"{task}#{sample}", task_id=task, sample_index=sample, group_id=task,
                         status="infra_failed" if failed else "completed", seed=100 + sample,
                         exit_reason=ExitReason.WORKER_DIED if failed else ExitReason.SUBMITTED,
                         reward=None if failed else reward)


def batch(policy):
    results = [member("a", 2, 1.0), member("a", 0, 0.0), member("a", 1, failed=True), member("a", 3, 1.0),
               member("b", 0, 1.0), member("b", 1, 1.0), member("b", 2, 0.0), member("b", 3, 0.0)]
    groups = apply_policy(group_results(results), GroupPolicy(**policy))
    return Batch(groups=[g for g in groups if not g.dropped], dropped=[g for g in groups if g.dropped])


def test_mask_keeps_the_group_with_a_placeholder_in_place():
    b = batch({"on_failure": "mask"})
    a = b.groups[0]
    assert [r.sample_index for r in a.results] == [0, 1, 2, 3]
    assert a.rewards == [0.0, 0.0, 1.0, 1.0] and a.mask == [True, False, True, True]
    assert a.seeds == [100, 101, 102, 103]
    assert b.failed == 1 and b.failures == {"worker_died": 1}
    assert b.rewards[1] == [1.0, 1.0, 0.0, 0.0]


def test_drop_leaves_out_groups_with_failures_and_says_why():
    b = batch({"on_failure": "drop"})
    assert [g.task_id for g in b.groups] == ["b"]
    assert [g.task_id for g in b.dropped] == ["a"] and "1 of 4" in b.dropped[0].drop_reason
    assert "1 dropped" in b.describe() and "worker_died=1" in b.describe()


def test_min_success_fraction_drops_thin_groups_whatever_the_policy():
    assert [g.task_id for g in batch({"min_success_fraction": 0.8}).dropped] == ["a"]  # 3/4 < 0.8
    assert batch({"min_success_fraction": 0.75}).dropped == []


def test_bad_policy_names_the_field():
    with pytest.raises(ValidationError, match="on_failure"):
        GroupPolicy(on_failure="ignore")
    with pytest.raises(ValidationError, match="min_success_fraction"):
        GroupPolicy(min_success_fraction=1.5)
