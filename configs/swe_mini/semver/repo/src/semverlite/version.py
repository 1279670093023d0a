"""Semantic versions: parsing and precedence."""

import re

_VERSION = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def parse(text):
    """``(major, minor, patch, prerelease)``; prerelease is a tuple of its dot-separated identifiers.

    Build metadata (after ``+``) is accepted and dropped: it never affects precedence.
    """
    match = _VERSION.match(text.strip())
    if match is None:
        raise ValueError(f"not a semantic version: {text!r}")
    major, minor, patch, pre, _build = match.groups()
    return int(major), int(minor), int(patch), tuple(pre.split(".")) if pre else ()


def _key(text):
    major, minor, patch, pre = parse(text)
    return (major, minor, patch, pre)


def compare(a, b):
    """-1, 0 or 1 as version ``a`` has lower, equal or higher precedence than ``b``."""
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)


def sort_versions(versions):
    """``versions`` from lowest to highest precedence."""
    return sorted(versions, key=_key)


def latest(versions):
    """The version with the highest precedence."""
    return max(versions, key=_key)
