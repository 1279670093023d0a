"""Parse and order semantic version strings."""

from semverlite.version import compare, latest, parse, sort_versions

__all__ = ["compare", "latest", "parse", "sort_versions"]
