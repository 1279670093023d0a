import pytest

from numerals import from_roman, to_roman

KNOWN = [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"),
         (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX")]


@pytest.mark.parametrize("number, numeral", KNOWN)
def test_known_values(number, numeral):
    assert to_roman(number) == numeral
    assert from_roman(numeral) == number


def test_round_trip_of_every_number():
    for number in range(1, 4000):
        assert from_roman(to_roman(number)) == number


def test_lower_case_and_spaces_are_accepted():
    assert from_roman("  xiv ") == 14


@pytest.mark.parametrize("number", [0, -3, 4000, 2.5, True])
def test_to_roman_rejects_what_it_cannot_write(number):
    with pytest.raises(ValueError):
        to_roman(number)


@pytest.mark.parametrize("text", ["ABC", "X X", "12"])
def test_from_roman_rejects_foreign_characters(text):
    with pytest.raises(ValueError):
        from_roman(text)
