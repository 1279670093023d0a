import pytest

from inifile import ParseError, get_bool, parse

SAMPLE = """
# global options
name = demo

[server]
Host = example.org
port = 8080

; a comment
[client]
retries=3
"""


def test_sections_and_pairs():
    assert parse(SAMPLE) == {
        "": {"name": "demo"},
        "server": {"host": "example.org", "port": "8080"},
        "client": {"retries": "3"},
    }


def test_no_global_section_when_unused():
    assert parse("[a]\nx = 1\n") == {"a": {"x": "1"}}


def test_repeated_section_is_extended():
    assert parse("[a]\nx = 1\n[b]\n[a]\ny = 2\n")["a"] == {"x": "1", "y": "2"}


def test_empty_value():
    assert parse("[a]\nx =\n") == {"a": {"x": ""}}


class TestErrors:
    def test_unclosed_header_names_the_line(self):
        with pytest.raises(ParseError) as info:
            parse("[a]\nx = 1\n[b\n")
        assert info.value.lineno == 3

    def test_line_without_equals_sign(self):
        with pytest.raises(ParseError, match="line 2: expected 'key = value'"):
            parse("[a]\njust words\n")

    def test_empty_key(self):
        with pytest.raises(ParseError, match="empty key"):
            parse("= value\n")


@pytest.mark.parametrize("word, expected", [("yes", True), ("Off", False), ("1", True), ("false", False)])
def test_get_bool(word, expected):
    assert get_bool({"flag": word}, "flag") is expected


def test_get_bool_default_and_garbage():
    assert get_bool({}, "flag", default=True) is True
    with pytest.raises(ValueError):
        get_bool({"flag": "maybe"}, "flag")
