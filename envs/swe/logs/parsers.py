"""Test logs → statuses, by the parser names SWE-bench 5.x rows give in ``log_parser`` (the Python ones), and the
parsers of SWE-smith's Python profiles and of SWE-Gym's pydantic rows. Each reads a log as that harness does."""

from __future__ import annotations

import re
from collections.abc import Callable

from envs.swe.logs.pytest_log import ERROR, FAILED, PASSED, SKIPPED, STATUSES, parse_log_pytest

Parser = Callable[[str], dict[str, str]]

_SKIP_COUNT = re.compile(r"\[\d+\]")
_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL = {code: None for code in range(1, 32)}
_OPTION = re.compile(r"(.*?)\[(.*)\]")


def _status_words(line: str) -> list[str] | None:
    """The words of a line that opens with a status (a failure's `` - `` separators dropped), or None."""
    if not line.startswith(STATUSES):
        return None
    return (line.replace(" - ", " ") if line.startswith(FAILED) else line).split()


def pytest5(log: str) -> dict[str, str]:
    """pytest ``-rA`` lines, id the second word; 5.x no longer reads ``SKIPPED [N] file:line`` summaries as tests."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        words = _status_words(line)
        if words and len(words) > 1 and not (words[0] == SKIPPED and _SKIP_COUNT.fullmatch(words[1])):
            found[words[1]] = words[0]
    return found


def pytest_options(log: str) -> dict[str, str]:
    """``pytest5``, a parameter that is an absolute path cut to its last component (``t[/a/b/c]`` → ``t[/c]``)."""
    found: dict[str, str] = {}
    for test, status in pytest5(log).items():
        split = _OPTION.search(test)
        if split:
            name, option = split.groups()
            if option.startswith("/") and not option.startswith("//") and "*" not in option:
                option = "/" + option.split("/")[-1]
            test = f"{name}[{option}]"
        found[test] = status
    return found


def pytest_v2(log: str) -> dict[str, str]:
    """Colour codes and control characters removed; ``STATUS id...`` (the id is the rest of the line, a failure's
    message cut off), or, for older pytest, ``id... STATUS``."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        line = _COLOUR.sub("", line).translate(_CONTROL)
        if line.startswith(STATUSES):
            words = (line.split(" - ", 1)[0] if line.startswith(FAILED) else line).split()
            if len(words) >= 2 and not (words[0] == SKIPPED and _SKIP_COUNT.fullmatch(words[1])):
                found[" ".join(words[1:])] = words[0]
        elif line.endswith(STATUSES):
            words = line.split()
            if len(words) >= 2:
                found[" ".join(words[:-1])] = words[-1]
    return found


def matplotlib(log: str) -> dict[str, str]:
    """``pytest5`` after mouse-button enums are printed as their numbers, as in the ids the datasets hold."""
    return pytest5(log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


_DJANGO_OK = (" ... ok", " ... OK", " ...  OK")
_DJANGO_SPLIT = (
    r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
    r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
    r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$",
)
"""A result that a long message split from its test's line (the test, then ``ok`` on a line of its own)."""


def django(log: str) -> dict[str, str]:
    """Django's runner: ``test (module.Class) ... ok|skipped|FAIL|ERROR``, ``FAIL:`` / ``ERROR:`` headers, and an
    ``ok`` on a later line for the last test named."""
    found: dict[str, str] = {}
    last = None
    for raw in log.split("\n"):
        line = raw.strip()
        if "--version is equivalent to version" in line:
            found["--version is equivalent to version"] = PASSED
        if " ... " in line:
            last = line.split(" ... ")[0]
        for ending in _DJANGO_OK:
            if line.endswith(ending):
                if line.startswith("Applying sites.0002_alter_domain_unique...test_no_migrations"):
                    line = line.split("...", 1)[-1].strip()
                found[line.rsplit(ending, 1)[0]] = PASSED
                break
        if " ... skipped" in line:
            found[line.split(" ... skipped")[0]] = SKIPPED
        if line.endswith(" ... FAIL"):
            found[line.split(" ... FAIL")[0]] = FAILED
        if line.startswith("FAIL:"):
            found[line.split()[1].strip()] = FAILED
        if line.endswith(" ... ERROR"):
            found[line.split(" ... ERROR")[0]] = ERROR
        if line.startswith("ERROR:"):
            found[line.split()[1].strip()] = ERROR
        if line.lstrip().startswith("ok") and last is not None:
            found[last] = PASSED
    for pattern in _DJANGO_SPLIT:
        for match in re.finditer(pattern, log, re.M):
            found[match.group(1)] = PASSED
    return found


def sympy(log: str) -> dict[str, str]:
    """SymPy's runner: ``____ path.py:test ____`` failure headers, then ``test_x ok|F|E`` lines."""
    found = {f"{m[1]}.py:{m[2]}": FAILED for m in re.findall(r"(_*) (.*)\.py:(.*) (_*)", log)}
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        for ending, status in ((" E", ERROR), (" F", FAILED), (" ok", PASSED)):
            if line.endswith(ending):
                found[line.split()[0]] = status
    return found


def seaborn(log: str) -> dict[str, str]:
    """``FAILED id``, ``PASSED id``, or ``id PASSED ...`` (pytest's verbose lines)."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith(FAILED):
            found[words[1]] = FAILED
        elif f" {PASSED} " in line:
            if words[1] == PASSED:
                found[words[0]] = PASSED
        elif line.startswith(PASSED):
            found[words[1]] = PASSED
    return found


def swesmith_pytest(log: str) -> dict[str, str]:
    """SWE-smith's Python profiles: ``id STATUS`` lines of ``pytest --verbose`` (a later status in the list wins)."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        for status in STATUSES:
            match = re.match(rf"^(\S+)(\s+){status}", line)
            if match:
                found[match.group(1)] = status
    return found


def pydantic_pytest(log: str) -> dict[str, str]:
    """SWE-Gym's pydantic rows: ``pytest_v2``'s cleaning, ``FAILED [ 12%]`` read as ``FAILED``; ``STATUS id`` or
    ``id STATUS``, the id one word."""
    found: dict[str, str] = {}
    for line in log.split("\n"):
        line = re.sub(r"FAILED\s*\[.*?\]", FAILED, _COLOUR.sub("", line).translate(_CONTROL))
        words = _status_words(line)
        if words is not None and len(words) > 1:
            found[words[1]] = words[0]
        elif words is None and line.endswith(STATUSES) and len(line.split()) > 1:
            found[line.split()[0]] = line.split()[1]
    return found


PARSERS: dict[str, Parser] = {
    "parse_log_pytest": pytest5, "parse_log_pytest_options": pytest_options, "parse_log_pytest_v2": pytest_v2,
    "parse_log_django": django, "parse_log_sympy": sympy, "parse_log_seaborn": seaborn,
    "parse_log_matplotlib": matplotlib,
    **{f"parse_log_{name}": pytest5 for name in ("astroid", "flask", "marshmallow", "pvlib", "pyvista", "sqlfluff",
                                                 "xarray")},
    **{f"parse_log_{name}": pytest_options for name in ("pydicom", "requests", "pylint")},
    **{f"parse_log_{name}": pytest_v2 for name in ("astropy", "scikit", "sphinx")},
}
"""The 5.x ``log_parser`` names we read, each with the semantics of the 5.x parser of that name."""

PYTEST_FAMILY = frozenset(name for name, parser in PARSERS.items() if parser in (pytest5, pytest_options, pytest_v2,
                                                                                  matplotlib))
"""Parsers whose ids are pytest node ids (so pytest's junitxml report can confirm their passing tests)."""

OTHERS: dict[str, Parser] = {"swesmith_pytest": swesmith_pytest, "pydantic_pytest": pydantic_pytest,
                             "swebench4_pytest": parse_log_pytest}
"""SWE-smith's and SWE-Gym's parsers (SWE-Gym's harness reads its other repositories as 4.x reads pytest)."""
