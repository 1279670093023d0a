import pytest

from intervals import covers, merge, total_length


def test_empty_input_gives_nothing():
    assert merge([]) == []


def test_disjoint_intervals_stay_apart_and_sorted():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_overlapping_intervals_merge():
    assert merge([(1, 4), (2, 6)]) == [(1, 6)]


def test_touching_intervals_merge():
    assert merge([(3, 5), (1, 3)]) == [(1, 5)]


def test_reversed_interval_is_rejected():
    with pytest.raises(ValueError, match="ends before it starts"):
        merge([(1, 2), (4, 3)])


class TestTotalLength:
    def test_overlap_is_counted_once(self):
        assert total_length([(0, 5), (3, 8)]) == 8

    def test_disjoint_lengths_add_up(self):
        assert total_length([(0, 1), (10, 12)]) == 3


@pytest.mark.parametrize("point, expected", [(0, True), (2, True), (3, False), (7, True)])
def test_covers(point, expected):
    assert covers([(0, 2), (5, 8)], point) is expected
