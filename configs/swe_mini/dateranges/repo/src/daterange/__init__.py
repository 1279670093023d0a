"""Iterate over calendar dates."""

from daterange.ranges import date_range, parse_span, weekdays

__all__ = ["date_range", "parse_span", "weekdays"]
