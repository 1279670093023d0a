"""Greedy word wrapping for plain text."""

from wrapping.wrap import fill, indent, wrap

__all__ = ["fill", "indent", "wrap"]
