import pytest

from runlength import decode, encode


@pytest.mark.parametrize("text, encoded", [("aaab", "3a1b"), ("abc", "1a1b1c"), ("", ""), ("  x", "2 1x")],
                         ids=["runs", "singles", "empty", "leading spaces"])
def test_encode(text, encoded):
    assert encode(text) == encoded


def test_decode():
    assert decode("3a1b") == "aaab"


def test_round_trip_of_short_runs():
    text = "hello   world!!"
    assert decode(encode(text)) == text


def test_digits_cannot_be_encoded():
    with pytest.raises(ValueError):
        encode("a1")


class TestMalformed:
    def test_missing_count(self):
        with pytest.raises(ValueError, match="missing count"):
            decode("3ab")

    def test_dangling_count(self):
        with pytest.raises(ValueError, match="at the end"):
            decode("2a3")
