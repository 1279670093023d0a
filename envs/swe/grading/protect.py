"""What grading keeps from the model patch: test files, conftest.py and pytest's configuration, reset to base."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Sequence

CONFTEST = "conftest.py"
WHOLE_CONFIG = ("pytest.ini", ".pytest.ini")
"""Files that are pytest configuration through and through: reset whole."""
SECTIONS = {
    "tox.ini": r"^[ \t]*\[[ \t]*pytest[ \t]*\]",
    "setup.cfg": r"^[ \t]*\[[ \t]*(tool:)?pytest[ \t]*\]",
    "pyproject.toml": r"^[ \t]*\[[ \t]*tool\.pytest([ \t]*\]|\.)",
}
"""Files that hold a pytest section among others (awk regexes of its header): only the section is restored."""
TEST_DIRS = ("tests", "test", "testing")
RESTORED = "restored-section"
"""Start of the line the reset step prints for each configuration file whose pytest section it put back."""

# Prints the pytest sections of a file (the base version, on stdin); then the patched file with its pytest
# sections replaced by those, where the first one was (or at the end). A header is any line opening with "[".
_EXTRACT = "{ if ($0 ~ /^[ \\t]*\\[/) keep = ($0 ~ /RE/) } keep"
_REPLACE = ('BEGIN { while ((getline line < sec) > 0) saved = saved line "\\n" }\n'
            '{ if ($0 ~ /^[ \\t]*\\[/) in_sec = ($0 ~ /RE/) }\n'
            'in_sec { if (!put) { printf "%s", saved; put = 1 }; next }\n{ print }\n'
            'END { if (!put) printf "%s", saved }')


def test_file_paths(test_ids: Iterable[str]) -> list[str]:
    """The files named by pytest node ids (the part before ``::``), safe relative paths only, in order; not the
    module of a doctest (``pkg/mod.py::pkg.mod.func``): that file is the code under test, which the fix changes."""
    paths = [t.split("::", 1)[0] for t in test_ids if "::" in t and not module_doctest(t)]
    return [p for p in dict.fromkeys(paths) if _safe(p)]


def module_doctest(test_id: str) -> bool:
    """Whether ``test_id`` names a doctest in a Python module (``--doctest-modules``): its item's name is dotted
    (``pkg.mod.func``), which no test function's or class's name is (a parameter id in brackets aside), or is the
    package's own name in its ``__init__.py``. (A top-level module's own docstring, ``mod.py::mod``, cannot be
    told from a test function named as its file, and is taken as a test.)"""
    path, _, rest = test_id.partition("::")
    name = re.sub(r"\[.*", "", rest)
    parts = path.split("/")
    return path.endswith(".py") and ("." in name or (parts[-1] == "__init__.py" and len(parts) > 1
                                                     and name == parts[-2]))


def to_reset(touched: Sequence[str], protected: Iterable[str]) -> list[str]:
    """The paths the patch touched that are reset whole to base: ``protected`` ones (test files), every
    conftest.py and pytest.ini."""
    keep = set(protected)
    return [p for p in touched if p in keep or posixpath.basename(p) in (CONFTEST, *WHOLE_CONFIG)]


def with_sections(touched: Sequence[str]) -> list[str]:
    """The configuration files the patch touched that may hold a pytest section (restored, not reset)."""
    return [p for p in touched if posixpath.basename(p) in SECTIONS]


def test_like(touched: Sequence[str], protected: Iterable[str]) -> list[str]:
    """The paths that strict grading refuses: test files (protected ones, conftest.py, ``test_*.py`` /
    ``*_test.py``, anything under a tests/, test/ or testing/ directory) and pytest configuration files."""
    keep = set(protected)
    found = []
    for path in touched:
        name, parts = posixpath.basename(path), path.split("/")[:-1]
        if (path in keep or name in (CONFTEST, *WHOLE_CONFIG, "tox.ini") or any(p in TEST_DIRS for p in parts)
                or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))):
            found.append(path)
    return found


def section_script(paths: Sequence[str], base: str, scratch: str, git: str = "git") -> str:
    """Shell lines that put back, in each of ``paths`` (configuration files the patch touched), the pytest
    section as it is at commit ``base`` (none when the file or section is not there), leaving the rest of
    the file as patched; a file made a symlink is reset whole. Prints ``restored-section <path>`` for each
    file it changed; exits non-zero on failure."""
    lines = []
    commit = shlex.quote(base)
    for path in paths:
        regex = SECTIONS[posixpath.basename(path)]
        extract, replace = (shlex.quote(p.replace("RE", regex.replace("/", "\\/"))) for p in (_EXTRACT, _REPLACE))
        lines += [
            f"p={shlex.quote(path)}",
            'if [ -L "$p" ]; then',
            f'  rm -f -- "$p" && {{ ! {git} cat-file -e {commit}:"$p" 2>/dev/null || '
            f'{git} --literal-pathspecs checkout -q {commit} -- "$p"; }} || exit 1',
            f'  echo "{RESTORED} $p"',
            'elif [ -f "$p" ]; then',
            f'  {{ {git} show {commit}:"$p" 2>/dev/null || true; }} | awk {extract} > "{scratch}/section" || exit 1',
            f'  awk -v sec="{scratch}/section" {replace} "$p" > "{scratch}/config" || exit 1',
            f'  cmp -s -- "{scratch}/config" "$p" || {{ cat -- "{scratch}/config" > "$p" && echo "{RESTORED} $p"; }}'
            ' || exit 1',
            "fi",
        ]
    return "\n".join(lines) if lines else "true"


def restored_sections(output: str) -> list[str]:
    """The files the section script said it changed."""
    prefix = f"{RESTORED} "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def _safe(path: str) -> bool:
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")
