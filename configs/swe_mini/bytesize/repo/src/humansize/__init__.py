"""Human-readable byte sizes."""

from humansize.units import format_size, parse_size

__all__ = ["format_size", "parse_size"]
