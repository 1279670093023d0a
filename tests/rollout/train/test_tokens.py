"""The contiguity check and the trainer segments: breaks named by turn and offset, never re-tokenized."""

from __future__ import annotations

import pytest

from rollout.train.tokens import contiguity_breaks, has_token_data, segments


def step(prompt, completion, logprobs=None):
    return {"prompt_token_ids": prompt, "completion_token_ids": completion,
            "logprobs": logprobs if logprobs is not None else [-0.5] * len(completion)}


def test_a_contiguous_rollout_is_one_segment_with_observations_masked():
    steps = [step([1, 2], [3, 4], [-0.1, -0.2]), step([1, 2, 3, 4, 9, 9], [5], [-0.3]),
             step([1, 2, 3, 4, 9, 9, 5, 8], [6])]
    assert has_token_data(steps) and contiguity_breaks(steps) == []
    (only,) = segments(steps)
    assert only.prompt_ids == [1, 2]
    assert only.response_ids == [3, 4, 9, 9, 5, 8, 6]
    assert only.loss_mask == [1, 1, 0, 0, 1, 0, 1]
    assert only.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.5]
    assert only.turns == [1, 2, 3]


def test_a_re_tokenized_turn_is_a_break_at_its_first_differing_token_and_starts_a_new_segment():
    # turn 2's prompt re-encodes turn 1's completion [3, 4] as [3, 7]: the stream breaks at offset 3
    steps = [step([1, 2], [3, 4]), step([1, 2, 3, 7, 9], [5]), step([1, 2, 3, 7, 9, 5, 8], [6])]
    (only_break,) = contiguity_breaks(steps)
    assert (only_break.turn, only_break.offset, only_break.expected) == (2, 3, 4)
    first, second = segments(steps)
    assert first.turns == [1] and first.response_ids == [3, 4]
    assert second.prompt_ids == [1, 2, 3, 7, 9] and second.response_ids == [5, 8, 6]
    assert second.loss_mask == [1, 0, 1] and second.turns == [2, 3]


def test_a_prompt_that_drops_earlier_tokens_is_a_break_at_its_end():
    steps = [step([1, 2, 3], [4]), step([1, 2], [5])]  # a template that dropped earlier reasoning
    (only_break,) = contiguity_breaks(steps)
    assert (only_break.turn, only_break.offset) == (2, 2)


def test_mask_mode_keeps_tokens_after_the_first_break_but_trains_on_none_of_them():
    steps = [step([1], [2]), step([1, 3], [4]), step([1, 3, 4], [5])]
    split, masked = segments(steps), segments(steps, on_break="mask")
    assert [s.response_ids for s in masked] == [s.response_ids for s in split]
    assert masked[0].loss_mask == [1] and all(m == 0 for s in masked[1:] for m in s.loss_mask)
    with pytest.raises(ValueError, match="on_break"):
        segments(steps, on_break="drop")


def test_turns_without_token_data_are_not_checked():
    assert not has_token_data([{"prompt_token_ids": None, "completion_token_ids": None}])
    assert not has_token_data([])
