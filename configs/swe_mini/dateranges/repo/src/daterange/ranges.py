"""date_range and friends: calendar dates between two dates, both ends included."""

from datetime import date, timedelta


def date_range(start, end, step=1):
    """Dates from ``start`` to ``end``, both included, ``step`` days apart.

    A negative ``step`` counts down (then ``end`` must not be after ``start``). The last date
    is ``end`` only when ``end`` is a whole number of steps away from ``start``.
    """
    if step == 0:
        raise ValueError("step must not be zero")
    delta = timedelta(days=step)
    current = start
    if step > 0:
        while current < end:
            yield current
            current += delta
    else:
        while current > end:
            yield current
            current += delta


def weekdays(start, end):
    """The Monday-to-Friday dates from ``start`` to ``end``, both included."""
    return [day for day in date_range(start, end) if day.weekday() < 5]


def parse_span(text):
    """``(start, end)`` from ``"YYYY-MM-DD..YYYY-MM-DD"``."""
    first, sep, last = text.partition("..")
    if not sep:
        raise ValueError(f"expected 'start..end', got {text!r}")
    start, end = date.fromisoformat(first.strip()), date.fromisoformat(last.strip())
    if end < start:
        raise ValueError(f"span {text!r} ends before it starts")
    return start, end
