"""Per-test statuses from pytest ``-rA`` logs, agreeing with the SWE-bench harness (4.1) pytest parser."""

from __future__ import annotations

import re

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
STATUSES = (FAILED, PASSED, SKIPPED, ERROR, XFAIL)
"""The harness's TestStatus values. pytest's XPASS is not one of them: an unexpected pass is not counted."""
PASSING = frozenset({PASSED, XFAIL})
"""A test in one of these counts as passing; FAILED / ERROR (or missing from the log) as failing; SKIPPED as neither."""
FAILING = frozenset({FAILED, ERROR})

START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
"""The harness's markers around the test command's output in an evaluation log."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_log_pytest(log: str) -> dict[str, str]:
    """Test id → status, exactly as the harness's ``parse_log_pytest`` reads a log.

    Its rules, kept on purpose so that FAIL_TO_PASS / PASS_TO_PASS lists made by the harness match:
    a line counts when it *starts* with a status word; a failure's `` - `` message separators are
    dropped; the id is the second whitespace-separated word and the status the first. So an id with a
    space is cut at the space (``test_x[a b]`` → ``test_x[a``), ``SKIPPED [1] file:3: why`` yields the
    id ``[1]``, coloured or indented lines count for nothing, and a later line wins.
    """
    statuses: dict[str, str] = {}
    for line in log.split("\n"):  # "\n" only: other line breaks stay inside a line, as the harness reads it
        entry = _harness_entry(line)
        if entry is not None:
            statuses[entry[0]] = entry[1]
    return statuses


def parse_test_statuses(log: str) -> dict[str, str]:
    """``parse_log_pytest`` plus what it cannot see, never overriding it: whole ids that contain
    whitespace (``tests/a.py::test_x[a b]``, so datasets written with pytest's own ids grade too)
    and lines pytest coloured (``--color=yes``). Every key the harness finds keeps the harness's status."""
    statuses = parse_log_pytest(log)
    extra: dict[str, str] = {}
    for line in log.split("\n"):
        plain = _ANSI.sub("", line)
        if plain != line:
            entry = _harness_entry(plain)
            if entry is not None and entry[0] not in statuses:
                extra[entry[0]] = entry[1]
        whole = _whole_id_entry(plain)
        if whole is not None:
            extra[whole[0]] = whole[1]
    statuses.update(extra)
    return statuses


def eval_section(log: str) -> str:
    """The part of an evaluation log between the start and end markers; the whole log without them."""
    start = log.find(START_MARKER)
    if start < 0:
        return log
    end = log.find(END_MARKER, start)
    if end < 0:
        return log
    return log[start + len(START_MARKER):end]


def _harness_entry(line: str) -> tuple[str, str] | None:
    if not line.startswith(STATUSES):
        return None
    if line.startswith(FAILED):
        line = line.replace(" - ", " ")
    words = line.split()
    if len(words) < 2:
        return None
    return words[1], words[0]


def _whole_id_entry(line: str) -> tuple[str, str] | None:
    """(id, status) for a short-summary line whose node id holds whitespace; None for any other line."""
    word, sep, rest = line.partition(" ")
    if not sep or word not in (PASSED, FAILED, ERROR, XFAIL):  # SKIPPED lines name a location, not an id
        return None
    node = _node_id(rest.rstrip())
    if not node or node != node.strip() or not any(ch.isspace() for ch in node):
        return None
    return node, word


def _node_id(rest: str) -> str:
    """The node id at the start of ``rest``: pytest writes ``<id>`` or ``<id> - <message>``.

    A parametrized id may itself hold `` - ``: its bracket ends at the first ``]`` that closes the
    line or comes right before `` - ``."""
    head = rest.split(" - ", 1)[0]
    bracket = head.find("[")
    if bracket < 0:
        return head
    close = rest.find("]", bracket)
    while close >= 0:
        tail = rest[close + 1:]
        if not tail or tail.startswith(" - "):
            return rest[: close + 1]
        close = rest.find("]", close + 1)
    return head
