"""Row shapes: SWE-bench 4.x, SWE-bench 5.x (``eval_script``, ``log_parser``, ``eval_type``, ``image``), SWE-smith
and SWE-Gym; a row's shape, its shape's fields checked at load, where its agent starts, and the plan of its grading."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from envs.images.image_names import is_swegym, swesmith_snapshot
from envs.swe.logs.parsers import PARSERS
from envs.swe.rows.v5 import EVAL_TYPES, script_problem
from rollout.errors import VerifierError

SWEBENCH4, SWEBENCH5, SWESMITH, SWEGYM = "swebench-4", "swebench-5", "swe-smith", "swe-gym"
V5_FIELDS = ("eval_script", "log_parser", "eval_type", "image")
APPLY_LADDER = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
"""The 4.x harness's commands (SWE-smith's too), most exact first; the first that exits 0 applied the patch."""
V5_LADDER = ("git apply --verbose", "git apply --verbose --3way", "git apply --verbose --reject",
             "patch --batch --forward --fuzz=5 -p1 -i")
"""The 5.x harness's commands."""

COMMIT_ISH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/~^@{}-]{0,199}")
"""A commit sha, branch, tag or ``HEAD~1``-style expression: never an option, never shell syntax."""
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
"""An image reference: never an option, never whitespace or shell syntax."""


@dataclass
class EvalPlan:
    """How an instance's tests run and are read: shell lines first, the test command, the log parser, whether only
    FAILED fails; the harness whose rules grade it, its apply ladder; a 5.x row's own eval script (which applies the
    test patch itself); refs checked out before the patch (SWE-smith: the instance branch, then ``HEAD~1``); the base
    test files are reset to (default: base_commit); and whether pytest's report confirms the log (None: when the
    command runs pytest)."""

    setup: str
    command: str
    parse: Callable[[str], dict[str, str]]
    fail_only: bool = False
    harness: str = SWEBENCH4
    ladder: tuple[str, ...] = APPLY_LADDER
    eval_script: str = ""
    checkout: tuple[str, ...] = ()
    base: str | None = None
    report: bool | None = None


def shape_of(data: Mapping[str, Any]) -> str:
    """A row's shape: 5.x when it carries any of its grading fields, SWE-smith by its repository snapshot (``repo``
    ``swesmith/...`` or such an instance id without base_commit), SWE-Gym by its repository, else SWE-bench 4.x."""
    if any(data.get(k) not in (None, "") for k in ("eval_script", "log_parser", "eval_type")):
        return SWEBENCH5
    if swesmith_snapshot(data) is not None:
        return SWESMITH
    if is_swegym(data):
        return SWEGYM
    return SWEBENCH4


def ref_problem(ref: object) -> str | None:
    """Why ``ref`` is not a commit sha or ref name we pass to git, or None."""
    if (not isinstance(ref, str) or COMMIT_ISH.fullmatch(ref) is None or ".." in ref
            or ref.endswith((".lock", "/", "."))):
        return f"{str(ref)[:80]!r} is not a commit sha or ref name"
    return None


def required_fields(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The string fields a row of this shape must have for a run (SWE-smith rows and 5.x rows may lack base_commit:
    the instance branch, or the image's checkout, is the base)."""
    return ("problem_statement",) if shape_of(data) in (SWESMITH, SWEBENCH5) else ("base_commit", "problem_statement")


def check_shape(ident: str, data: Mapping[str, Any]) -> None:
    """The shape's own fields, at load: a ValueError naming the first bad one."""
    shape = shape_of(data)
    if shape == SWEBENCH5:
        missing = [k for k in V5_FIELDS if not isinstance(data.get(k), str) or not data[k].strip()]
        if missing:
            raise ValueError(f"field {missing[0]}: missing or not a string (a SWE-bench 5.x row has "
                             f"{', '.join(V5_FIELDS)})")
        problem = script_problem(data["eval_script"])
        if problem:
            raise ValueError(f"field eval_script: {problem}")
        if data["log_parser"] not in PARSERS:
            raise ValueError(f"field log_parser: {data['log_parser'][:80]!r} is not a parser we read (ours: the "
                             f"Python ones, {', '.join(sorted(PARSERS)[:4])}, ...)")
        if data["eval_type"] not in EVAL_TYPES:
            raise ValueError(f"field eval_type: {data['eval_type'][:80]!r} is not one of {', '.join(EVAL_TYPES)}")
        if IMAGE_REF.fullmatch(data["image"].strip()) is None:
            raise ValueError(f"field image: {data['image'][:80]!r} is not an image reference")
        if data.get("image_assets") not in (None, "", {}, "{}"):
            raise ValueError("field image_assets: binary test assets (fetched at grading by the harness) are not "
                             "supported here")
    elif shape == SWESMITH:
        problem = ref_problem(ident)
        if problem:
            raise ValueError(f"field instance_id: a SWE-smith instance id names its branch, and {problem}")
    elif (shape == SWEGYM and str(data.get("repo")).lower() == "python/mypy" and not data.get("test_cmd")
          and "[case " not in str(data.get("test_patch") or "")):
        raise ValueError("field test_patch: a python/mypy row without test_cmd selects its tests by the test patch's "
                         "[case ...] names, and it has none")


def start_ref(ident: str, data: Mapping[str, Any]) -> str | None:
    """What the agent's repository is checked out at before it starts, when the image is not there already:
    a SWE-smith row's instance branch (its bug, its failing tests removed)."""
    return ident if shape_of(data) == SWESMITH else None


def agent_base(ident: str, data: Mapping[str, Any]) -> str:
    """The commit the agent's work is a diff against."""
    return str(data.get("base_commit") or start_ref(ident, data) or "HEAD")


def tests_of(task_data: Mapping[str, Any], key: str, ident: str) -> list[str]:
    """A row's list of test ids (a list, or JSON holding one); a VerifierError when it is neither."""
    value = task_data.get(key)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise VerifierError(f"instance {ident}: {key} is neither a list nor a JSON list", retryable=False) from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise VerifierError(f"instance {ident}: {key} must be a list of test ids", retryable=False)
    return value
