"""Union of closed intervals given as (start, end) pairs."""


def _checked(intervals):
    ordered = sorted(intervals)
    for start, end in ordered:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) ends before it starts")
    return ordered


def merge(intervals):
    """The union of ``intervals`` as a sorted list of disjoint (start, end) pairs.

    Intervals are closed, so (1, 3) and (3, 5) share the point 3 and merge into (1, 5).
    """
    merged = []
    for start, end in _checked(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    """How much of the line ``intervals`` cover, counting overlaps once."""
    return sum(end - start for start, end in merge(intervals))


def covers(intervals, point):
    """Whether ``point`` lies inside one of ``intervals``."""
    return any(start <= point <= end for start, end in merge(intervals))
