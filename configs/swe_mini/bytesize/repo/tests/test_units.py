import pytest

from humansize import format_size, parse_size


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 * 1024**3, "5.0 GiB")],
)
def test_format_size(n, text):
    assert format_size(n) == text


def test_precision():
    assert format_size(1234567, precision=3) == "1.177 MiB"


def test_negative_sizes_keep_their_sign():
    assert format_size(-2048) == "-2.0 KiB"


def test_largest_unit_is_used_past_its_limit():
    assert format_size(3 * 1024**6) == "3072.0 PiB"


class TestParseSize:
    @pytest.mark.parametrize(
        "text, n",
        [("1.5 KiB", 1536), ("10", 10), ("2mib", 2 * 1024**2), (" 1 GiB ", 1024**3)],
        ids=["fraction", "no unit", "lower case", "surrounding spaces"],
    )
    def test_valid(self, text, n):
        assert parse_size(text) == n

    @pytest.mark.parametrize("text", ["1,5 KiB", "KiB", "1.5 KB", "-1 B"])
    def test_invalid(self, text):
        with pytest.raises(ValueError):
            parse_size(text)
