"""Merge and measure closed intervals."""

from intervals.merge import covers, merge, total_length

__all__ = ["covers", "merge", "total_length"]
