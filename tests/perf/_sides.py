"""Did each side of a comparison do the work? A ratio against a side that did not is no measurement.

A bench gives every side it times a ``Side``: how many units of work it was asked for, how many it did right
(resolved, completed, answered), and its first error. ``ratio`` prints the ratio only when every side it compares
did all its work; otherwise ``no ratio: <side> failed N/M: <first error>``, so a baseline that failed in seconds
(every container refused to start) never shows as the farm being slow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Side:
    name: str
    total: int
    """Units of work asked for (instances, rollouts, requests)."""
    done: int
    """Units done right (resolved, completed, answered)."""
    error: str = ""
    """The first error seen, in one line (empty when none was seen)."""

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.done == self.total and not self.error

    def failure(self) -> str:
        why = self.error or ("nothing to do" if self.total <= 0 else "no error reported")
        return f"{self.name} failed {self.total - self.done}/{self.total}: {one_line(why)}"


def one_line(text: str, limit: int = 200) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failed(*sides: Side) -> str:
    """``no ratio: ...`` naming each side that did not do its work; empty when every side did."""
    bad = [side.failure() for side in sides if not side.ok]
    return "no ratio: " + "; ".join(bad) if bad else ""


def ratio(numerator: float, denominator: float, *sides: Side, spec: str = ".2f", suffix: str = "x") -> str:
    """``numerator / denominator`` formatted, or why there is no ratio (a side failed, or the baseline is 0)."""
    problem = failed(*sides)
    if problem:
        return problem
    if not denominator:
        return "no ratio: the baseline measured 0"
    return f"{numerator / denominator:{spec}}{suffix}"
