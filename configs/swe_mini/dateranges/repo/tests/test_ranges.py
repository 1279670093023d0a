from datetime import date

import pytest

from daterange import date_range, parse_span, weekdays

JAN1 = date(2024, 1, 1)


def test_weekly_steps_that_miss_the_end():
    assert list(date_range(JAN1, date(2024, 1, 10), step=7)) == [JAN1, date(2024, 1, 8)]


def test_empty_when_end_is_before_start():
    assert list(date_range(date(2024, 1, 5), JAN1)) == []


def test_zero_step_is_rejected():
    with pytest.raises(ValueError):
        list(date_range(JAN1, JAN1, step=0))


def test_crosses_a_leap_day():
    days = list(date_range(date(2024, 2, 27), date(2024, 3, 5), step=2))
    assert days == [date(2024, 2, 27), date(2024, 2, 29), date(2024, 3, 2), date(2024, 3, 4)]


def test_weekdays_skip_the_weekend():
    # 2024-01-06 is a Saturday, 2024-01-07 a Sunday.
    assert weekdays(date(2024, 1, 4), date(2024, 1, 7)) == [date(2024, 1, 4), date(2024, 1, 5)]


class TestParseSpan:
    def test_valid(self):
        assert parse_span("2024-01-01 .. 2024-01-31") == (JAN1, date(2024, 1, 31))

    @pytest.mark.parametrize("text", ["2024-01-01", "2024-02-01..2024-01-01", "2024-13-01..2024-12-01"])
    def test_invalid(self, text):
        with pytest.raises(ValueError):
            parse_span(text)
