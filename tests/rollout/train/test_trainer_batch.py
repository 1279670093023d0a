"""Trainer samples from grouped results: the loss mask covers exactly the model's tokens, logprobs are the
engine's there and 0 elsewhere, per-token policy versions, GRPO group statistics, a token break starts a new
sample, failed and stale members have none, padded arrays."""

from __future__ import annotations

import pytest

from rollout.records import RolloutResult, Step, Trajectory
from rollout.train.groups import Batch, group_results


def step(index, prompt, completion, version="1"):
    return Step(index=index, message={"role": "assistant", "content": "x"}, prompt_token_ids=prompt,
                completion_token_ids=completion, logprobs=[-0.5] * len(completion), policy_version=version)


def result(sample, reward, steps, status="completed", stale=False):
    return RolloutResult(rollout_id=f"t#{sample}", task_id="t", group_id="t", sample_index=sample, status=status,
                         exit_reason="submitted" if status == "completed" else "model_error", reward=reward,
                         trajectory=Trajectory(steps=steps), metadata={"stale": True} if stale else {})


def contiguous(version_2="1"):
    # turn 1: prompt [1,2,3] → [4,5]; turn 2 prompt = [1,2,3,4,5] + observation [6,7] → [8]
    return [step(1, [1, 2, 3], [4, 5]), step(2, [1, 2, 3, 4, 5, 6, 7], [8], version_2)]


def test_one_sample_per_rollout_with_the_mask_on_model_tokens_only():
    batch = Batch(groups=group_results([result(0, 1.0, contiguous("2")), result(1, 0.0, contiguous())]))
    first, second = batch.samples()
    assert first.prompt_ids == [1, 2, 3] and first.response_ids == [4, 5, 6, 7, 8]
    assert first.loss_mask == [1, 1, 0, 0, 1]
    assert first.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert first.policy_versions == ["1", "1", "2", "2", "2"]
    assert (first.group_mean, first.group_std) == (0.5, 0.5)
    assert first.advantage == pytest.approx(1.0, abs=1e-4) and second.advantage == pytest.approx(-1.0, abs=1e-4)
    assert first.num_turns == 2 and first.exit_reason == "submitted"


def test_a_token_break_starts_a_new_sample_never_a_retokenization():
    drifted = [step(1, [1, 2, 3], [4, 5]), step(2, [1, 2, 9, 4, 5, 6], [7])]  # turn 2 re-rendered turn 1
    samples = Batch(groups=group_results([result(0, 1.0, drifted)])).samples()
    assert [s.segment for s in samples] == [0, 1]
    assert samples[1].prompt_ids == [1, 2, 9, 4, 5, 6] and samples[1].response_ids == [7]
    assert samples[1].loss_mask == [1] and samples[0].response_ids == [4, 5]
    masked = Batch(groups=group_results([result(0, 1.0, drifted)])).samples(on_break="mask")
    assert masked[1].loss_mask == [0]


def test_failed_and_stale_members_have_no_sample_and_leave_the_group_statistics():
    members = [result(0, 1.0, contiguous()), result(1, None, [], status="infra_failed"),
               result(2, 0.0, contiguous(), stale=True), result(3, 0.0, contiguous())]
    batch = Batch(groups=group_results(members))
    samples = batch.samples()
    assert [s.sample_index for s in samples] == [0, 3]
    assert samples[0].group_rewards == [1.0, 0.0]
    assert batch.masks == [[True, False, False, True]]


def test_padded_arrays():
    np = pytest.importorskip("numpy")
    batch = Batch(groups=group_results([result(0, 1.0, contiguous()), result(1, 0.0, [step(1, [7], [8, 9, 10])])]))
    arrays = batch.padded(pad_id=-1)
    assert arrays["prompt_ids"].tolist() == [[1, 2, 3], [-1, -1, 7]]
    assert arrays["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert arrays["response_ids"].tolist() == [[4, 5, 6, 7, 8], [8, 9, 10, -1, -1]]
    assert arrays["loss_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]]
    assert arrays["response_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert np.allclose(arrays["rewards"], [1.0, 0.0])
