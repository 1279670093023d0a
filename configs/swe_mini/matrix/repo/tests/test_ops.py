import pytest

from matrixops import add, identity, multiply, shape, transpose

A = [[1, 2], [3, 4]]


class TestShape:
    def test_rows_and_columns(self):
        assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)

    @pytest.mark.parametrize("bad", [[], [[]], [[1, 2], [3]]])
    def test_rejects_malformed(self, bad):
        with pytest.raises(ValueError):
            shape(bad)


def test_identity():
    assert identity(3) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]


def test_transpose_of_a_wide_matrix():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_add():
    assert add(A, A) == [[2, 4], [6, 8]]


def test_square_product():
    assert multiply(A, [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]


def test_identity_is_neutral():
    assert multiply(A, identity(2)) == A == multiply(identity(2), A)


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="cannot multiply a 2x2 matrix by a 3x1 matrix"):
        multiply(A, [[1], [2], [3]])
