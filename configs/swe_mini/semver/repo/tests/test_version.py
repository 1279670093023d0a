import pytest

from semverlite import compare, parse, sort_versions


def test_parse_core_and_prerelease():
    assert parse("1.2.3") == (1, 2, 3, ())
    assert parse("1.2.3-rc.1") == (1, 2, 3, ("rc", "1"))


def test_build_metadata_is_dropped():
    assert parse("1.0.0+build.7") == parse("1.0.0")


@pytest.mark.parametrize("bad", ["1.2", "01.2.3", "1.2.3-", "v1.2.3", "1.2.3-a..b"])
def test_invalid_versions_are_rejected(bad):
    with pytest.raises(ValueError):
        parse(bad)


class TestCompare:
    def test_numeric_not_lexical(self):
        assert compare("1.10.0", "1.9.0") == 1

    def test_equal(self):
        assert compare("2.0.0+a", "2.0.0+b") == 0

    def test_prereleases_of_the_same_kind(self):
        assert compare("1.0.0-alpha", "1.0.0-beta") == -1

    def test_longer_prerelease_is_higher(self):
        assert compare("1.0.0-alpha", "1.0.0-alpha.beta") == -1


def test_sort_release_lines():
    assert sort_versions(["2.0.0", "1.10.1", "1.2.0"]) == ["1.2.0", "1.10.1", "2.0.0"]
