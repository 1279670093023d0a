"""A small parser for INI-style configuration text."""

from inifile.parser import ParseError, get_bool, parse

__all__ = ["ParseError", "get_bool", "parse"]
