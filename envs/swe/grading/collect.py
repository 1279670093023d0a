"""Which test files a pytest command collects whole: where a test of the grader's own (a canary, a twin) surely runs
and is reported as the instance's tests are."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence

from envs.swe.grading.protect import module_doctest

NARROWING = ("-k", "-m", "--deselect", "-x", "--exitfirst", "--maxfail", "--lf", "--last-failed", "--ff",
             "--failed-first", "--sw", "--stepwise", "--co", "--collect-only", "--pdb")
"""Options under which a canary might not run (selection, stopping early) or report differently: no canaries."""
VALUED = ("-p", "-o", "-W", "-n", "-c", "--tb", "--rootdir", "--junitxml", "--durations", "--timeout",
          "--override-ini", "--color", "--import-mode", "--basetemp", "--confcutdir", "--ignore", "--ignore-glob")
"""Options whose value is the next word (never a path to collect)."""

def collected(command: str, test_ids: Sequence[str], skip: Iterable[str] = ()) -> dict[str, list[str]]:
    """``test_ids`` by test file, for the files ``command`` collects whole (named on it as a file or under a directory
    named on it, or no path named at all), except those in ``skip``; none when the command narrows what runs
    (``NARROWING``) or is not a plain pytest command line: where a test of the grader's own surely runs."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return {}
    runner = next((i for i, w in enumerate(words) if re.fullmatch(r"(.*/)?py\.?test", w)
                   or (w == "-m" and i + 1 < len(words) and words[i + 1] in ("pytest", "py.test"))), None)
    if runner is None:
        return {}
    rest = words[runner + (2 if words[runner] == "-m" else 1):]
    if any(w in ("&&", "||", ";", "|") or _narrows(w) for w in rest):
        return {}
    positional = [w for i, w in enumerate(rest) if not w.startswith("-") and (i == 0 or rest[i - 1] not in VALUED)]
    named = [w for w in positional if "::" not in w] if positional else None
    by_file: dict[str, list[str]] = {}
    for test in test_ids:
        path = test.split("::", 1)[0]
        # Only ids of Python test functions (a doctest's item is the module under test, not a test file).
        function = re.sub(r"\[.*", "", test.split("::")[-1])
        if ("::" in test and path.endswith(".py") and path not in skip and not module_doctest(test)
                and function.isidentifier() and _collected(path, named)):
            by_file.setdefault(path, []).append(test)
    return by_file


def _narrows(word: str) -> bool:
    return (word in NARROWING or word.startswith(tuple(f"{o}=" for o in NARROWING if o.startswith("--")))
            or (word[:2] in ("-k", "-m") and len(word) > 2))


def _collected(path: str, named: Sequence[str] | None) -> bool:
    """Whether the command's paths take ``path`` in whole; with none it runs the whole suite, which holds the
    instance's test files."""
    if named is None:
        return True
    for arg in named:
        arg = arg.removeprefix("./").rstrip("/")
        if arg in ("", ".") or arg == path or path.startswith(arg + "/"):
            return True
    return False
