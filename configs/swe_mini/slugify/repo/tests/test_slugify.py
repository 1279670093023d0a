import pytest

from slugs import slugify, unique_slug


def test_simple_title():
    assert slugify("Hello, World!") == "hello-world"


def test_runs_of_punctuation_collapse():
    assert slugify("  a -- b __ c  ") == "a-b-c"


@pytest.mark.parametrize("text", ["a b", "x[y]"])
def test_spaces_and_brackets_become_separators(text):
    assert slugify(text) == text[0] + "-" + text[2]


def test_custom_separator():
    assert slugify("Release notes 2.0", separator="_") == "release_notes_2_0"


def test_max_length_never_ends_with_a_separator():
    assert slugify("one two three", max_length=8) == "one-two"


class TestUniqueSlug:
    def test_free_slug_is_kept(self):
        assert unique_slug("Intro", set()) == "intro"

    def test_numbers_are_appended(self):
        assert unique_slug("Intro", {"intro", "intro-2"}) == "intro-3"

    def test_empty_title_gets_a_placeholder(self):
        assert unique_slug("!!!", set()) == "item"


@pytest.mark.skip(reason="transliteration of non-Latin scripts is not supported")
def test_cyrillic_is_transliterated():
    assert slugify("Привет мир") == "privet-mir"
