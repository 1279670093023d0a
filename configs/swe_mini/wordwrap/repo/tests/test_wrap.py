import pytest

from wrapping import fill, indent, wrap


def test_short_text_is_one_line():
    assert wrap("hello world", 40) == ["hello world"]


def test_empty_and_blank_text():
    assert wrap("", 10) == [] and wrap("   \n ", 10) == []


def test_whitespace_runs_collapse():
    assert wrap("a \t b\n\nc", 40) == ["a b c"]


def test_long_word_gets_its_own_line():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]


def test_lines_break_between_words():
    assert wrap("the quick brown fox", 12) == ["the quick", "brown fox"]


@pytest.mark.parametrize("width", [0, -1])
def test_width_must_be_positive(width):
    with pytest.raises(ValueError):
        wrap("text", width)


def test_fill_joins_lines():
    assert fill("one two three", 9) == "one two\nthree"


def test_indent_prefixes_every_line():
    assert indent("one two three four", 14, prefix="> ") == "> one two\n> three four"
