"""Per-column statistics of CSV text."""

from csvsummary.summary import format_summary, summarize

__all__ = ["format_summary", "summarize"]
