"""Canaries: tests of the grader's own, with outcomes it knows, added to the test files a grading run collects.

Code under test runs inside pytest's process and could rewrite outcomes in memory (a patched report object, a
hook on the live plugin manager). Each grading adds, to one or two of the instance's collected test files, a test
that must pass (where no renamed copy of a real PASS_TO_PASS test, ``envs.swe.grading.twins``, stands for it) and
three that must fail (in the three ways a test fails: so forcing only one kind of failure is
caught too), named like the instance's own tests from their words (new per grading, so no patch can know them),
appended after the test patch. Whatever forces outcomes
forces theirs too: a must-fail canary reported passing, a must-pass canary failing, or canaries missing from a
file whose other tests reported (the process ended early, or its output was replaced) is tampering. The
instance's own statuses are read as before: canary ids are in no FAIL_TO_PASS / PASS_TO_PASS list.
"""

from __future__ import annotations

import builtins
import keyword
import random
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from envs.swe.grading.collect import collected
from envs.swe.logs.pytest_log import FAILED, PASSING
from envs.swe.logs.pytest_report import REPORT_PASSED, junit_address

PLACED = "canary-placed"
"""Start of the line the canary step prints for each file it added canaries to."""
WORDS = ("range", "value", "order", "input", "empty", "limit", "round", "parse", "merge", "split", "check", "width",
         "count", "total", "index", "other", "again", "basic", "large", "small", "first", "last", "single", "mixed")
"""Words for canary names, beside those of the instance's own test names."""


@dataclass
class Canary:
    node_id: str
    passes: bool


@dataclass
class CanaryFile:
    path: str
    names: list[str]
    """Function and class names the canaries define (the step skips the file if any is already there)."""
    text: str
    canaries: list[Canary] = field(default_factory=list)
    unit_text: str = ""
    """The text for a file whose tests are unittest TestCases (the canaries' class one too: pytest collects a
    TestCase whatever its name, a plain class only by its ``python_classes`` patterns); "" when the canaries are
    functions."""


def plan(command: str, test_ids: Sequence[str], skip: Iterable[str] = (), rng: random.Random | None = None,
         files: int = 2, prefer: Sequence[str] = (), must_pass: bool = True,
         taken: Iterable[str] = ()) -> list[CanaryFile]:
    """Canaries for up to ``files`` of the test files named by ``test_ids`` that ``command`` collects whole (named
    on it as a file or under a directory named on it, or no path named at all), except those in ``skip``; none when
    the command narrows what runs (``NARROWING``) or is not a plain pytest command line. Files of the ``prefer`` ids
    are chosen first. ``must_pass`` false: no must-pass canary (renamed copies of real PASS_TO_PASS tests,
    ``envs.swe.grading.twins``, stand for it, and no generator's shape marks them); names never in ``taken``."""
    rng = rng or random.SystemRandom()
    by_file = collected(command, test_ids, skip)
    # Files of FAIL_TO_PASS tests first: none of them can be marked xfail as a whole (a must-fail canary there would
    # be reported XFAIL, which counts as passing).
    first = [f for f in sorted(by_file) if any(t.split("::", 1)[0] == f for t in prefer)] or sorted(by_file)
    chosen = rng.sample(first, min(files, len(first)))
    return [_canaries(path, by_file[path], rng, must_pass, set(taken)) for path in chosen]


def _canaries(path: str, tests: Sequence[str], rng: random.Random, must_pass: bool = True,
              taken: set[str] | None = None) -> CanaryFile:
    """One must-pass (unless not ``must_pass``) and three must-fail canaries (in random order), as a class of tests
    if the file's tests are in classes. The must-fail ones fail in the three ways a test fails (an assertion, an
    expected exception not raised, an exception raised), so forcing only one kind of failure to pass is caught too."""
    parts = [t.split("::")[1:] for t in tests]
    functions = [re.sub(r"\[.*", "", p[-1]) for p in parts]
    vocabulary = [w for f in functions for w in f.split("_")[1:-1] if w.isalpha()] or list(WORDS)
    taken = {*functions, *(taken or ())}
    plan_ = [*([(True, rng.choice(PASSING_KINDS))] if must_pass else []), *((False, k) for k in FAILING_KINDS)]
    rng.shuffle(plan_)
    classes = [p[0] for p in parts if len(p) > 1]
    owner = _class_name(rng.choice(classes), rng) if classes else None
    names, lines = ([owner] if owner else []), ["", "", "import pytest", "", ""]
    canaries = []
    if owner:
        lines.append(f"class {owner}:")
    for passes, kind in plan_:
        name = _function_name(rng.choice(functions), vocabulary, rng, taken)
        taken.add(name)
        names.append(name)
        canaries.append(Canary(f"{path}::{owner}::{name}" if owner else f"{path}::{name}", passes))
        lines += _body(name, kind, rng, "    " if owner else "", "self" if owner else "", vocabulary)
        lines.append("")
    text = "\n".join(lines) + "\n"
    unit = text.replace("import pytest\n", "import pytest\nimport unittest\n", 1).replace(
        f"class {owner}:", f"class {owner}(unittest.TestCase):", 1) if owner else ""
    return CanaryFile(path, names, text, canaries, unit)


def _function_name(model: str, vocabulary: Sequence[str], rng: random.Random, taken: set[str]) -> str:
    """A name like ``model``: its first and last words kept (so pytest's name patterns take it as they take the
    instance's), two words between from the instance's names and the canary words."""
    words = model.split("_")
    head, tail = words[0] or "test", words[-1] if len(words) > 1 else words[0] or "test"
    own = sorted(set(vocabulary))
    while True:
        # The instance's own words where it has enough of them (then no word marks a canary), else ours too.
        middle = rng.sample(own, 2) if len(own) >= 4 else [rng.choice(vocabulary), rng.choice(WORDS)]
        rng.shuffle(middle)
        name = "_".join([head, *middle, tail])
        if name not in taken:
            return name


def _class_name(model: str, rng: random.Random) -> str:
    """A class name like ``model``: a word put after its first CamelCase word (a one-word name: itself around the
    new word), so prefix and suffix patterns match it as they match ``model``."""
    words = re.findall(r"[A-Z][a-z0-9]*|[a-z0-9]+", model) or ["Test"]
    extra = rng.choice(WORDS).capitalize()
    return words[0] + extra + ("".join(words[1:]) if len(words) > 1 else words[0])


PASSING_KINDS = ("equal", "raises")
FAILING_KINDS = ("unequal", "not-raised", "error")


def _body(name: str, kind: str, rng: random.Random, indent: str, self_arg: str,
          vocabulary: Sequence[str] = WORDS) -> list[str]:
    """A short test of ``kind`` (``PASSING_KINDS`` pass, ``FAILING_KINDS`` fail), in one of several shapes, its
    variable named from the instance's words."""
    var = rng.choice([w for w in vocabulary if w.isidentifier() and w.islower() and not keyword.iskeyword(w)
                      and not hasattr(builtins, w)] or list(WORDS))
    head = f"{indent}def {name}({self_arg}):"
    if kind in ("raises", "not-raised", "error"):
        text = repr(rng.choice(WORDS) if kind != "not-raised" else str(rng.randint(10, 999)))
        call = rng.choice([f"int({var})", f"float({var}) * 2", f"[int({var})]"])
        if kind == "error":
            return [head, f"{indent}    {var} = {text}", f"{indent}    assert {call}"]
        return [head, f"{indent}    {var} = {text}", f"{indent}    with pytest.raises(ValueError):",
                f"{indent}        {call}"]
    items = [rng.randint(2, 97) for _ in range(rng.randint(3, 6))]
    shapes = [(f"sum({var})", sum(items)), (f"max({var})", max(items)), (f"min({var})", min(items)),
              (f"len({var})", len(items)), (f"sorted({var})[-1]", sorted(items)[-1]),
              (f"{var}[0] + {var}[-1]", items[0] + items[-1]), (f"len(set({var}))", len(set(items)))]
    expr, right = rng.choice(shapes)
    expected = right if kind == "equal" else right + rng.choice((-3, -2, -1, 1, 2, 3))
    setup = (f"{var} = {items!r}" if rng.random() < 0.5
             else f"{var} = [{', '.join(str(i) for i in items)}]")
    check = (f"assert {expr} == {expected}" if rng.random() < 0.5 else f"assert {expected} == {expr}")
    return [head, f"{indent}    {setup}", f"{indent}    {check}"]


def step_script(files: Sequence[CanaryFile]) -> str:
    """Shell lines that append each file's canaries when the file is there and defines none of their names (as a
    TestCase when the file uses TestCase); prints ``canary-placed <path>`` for each."""
    lines = []
    for item in files:
        defined = r"^[[:space:]]*(def|class) (" + "|".join(re.escape(n) for n in item.names) + r")\b"
        lines += [f"p={shlex.quote(item.path)}",
                  f'if [ -f "$p" ] && [ ! -L "$p" ] && ! grep -qE {shlex.quote(defined)} -- "$p"; then',
                  f"  t={shlex.quote(item.text)}"]
        if item.unit_text:
            lines.append(f"  grep -q TestCase -- \"$p\" && t={shlex.quote(item.unit_text)}")
        lines += ["  printf '%s' \"$t\" >> \"$p\" && echo \"" + PLACED + " $p\"", "fi"]
    return "\n".join(lines) if lines else "true"


def placed(output: str, files: Sequence[CanaryFile]) -> list[Canary]:
    """The canaries of the files the step said it changed."""
    done = {line[len(PLACED) + 1:] for line in output.splitlines() if line.startswith(PLACED + " ")}
    return [c for f in files if f.path in done for c in f.canaries]


def evidence(canaries: Sequence[Canary], statuses: Mapping[str, str],
             cases: list[tuple[str, str, str]] | None) -> list[str]:
    """What the log (``statuses``) and pytest's report (``cases``; None: none written) show against the canaries:
    a must-fail one passing, a must-pass one failing, or one missing from a log that lists other tests of its file
    passing (or from a report, while the log has it)."""
    found = []
    report = {(c, n): outcome for c, n, outcome in cases or ()}
    for canary in canaries:
        path = canary.node_id.split("::", 1)[0]
        want = "pass" if canary.passes else "fail"
        status = statuses.get(canary.node_id)
        if status is None:
            # Missing counts only where the log lists passing tests of the file (-rA, verbose): there it must be.
            if any(t.split("::", 1)[0] == path and s in PASSING for t, s in statuses.items() if t != canary.node_id):
                found.append(f"{canary.node_id} (must {want}) is missing from the log")
        elif (canary.passes and status == FAILED) or (not canary.passes and status in PASSING):
            found.append(f"{canary.node_id} (must {want}) is {status} in the log")
        if cases is None:
            continue
        classname, name = junit_address(canary.node_id)
        outcome = next((o for (c, n), o in report.items() if n == name and (c == classname or
                                                                            classname.endswith("." + c))), None)
        if outcome is None:
            if status is not None:
                found.append(f"{canary.node_id} (must {want}) is missing from pytest's report")
        elif (canary.passes and outcome == "failure") or (not canary.passes and outcome in (REPORT_PASSED, "xfail")):
            found.append(f"{canary.node_id} (must {want}) is {outcome} in pytest's report")
    return found
