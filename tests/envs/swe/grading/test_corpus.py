"""The grading conformance corpus (tests/corpus): real upstream bug fixes of real projects, graded in docker.

For each instance of the CI subset (one of every project kind, ``CI_SUBSET``): the gold patch resolves, the empty
patch and the corpus's wrong patch do not, and our report.json equals what swebench 4.1's ``get_eval_report`` and
5.x's (its own venv) make of the same (whole) log; a 5.x-shaped row (its own ``eval_script`` and ``log_parser``: a
project whose own runner prints unittest's output) is compared with 5.x's only, as 4.x has no such row. Such a row's
``image`` is only a name: its image is built from ``repo_path`` like the others'. ``ROLLOUT_CORPUS=all`` runs every
instance, ``ROLLOUT_CORPUS=a,b`` those named; the bench (``tests/perf/bench_grading.py --corpus``) grades every gold
patch too.

``tests/corpus/known_failures.json`` lists what the grader gets wrong today, with the reason: ``gold_unresolved``
instances must still grade unresolved (then xfail), so the day the grader is fixed the test says so and the entry
must go, and everything else about them is still checked; ``grading_hangs`` instances never return when graded and
are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from envs.images.image_names import image_for
from envs.swe.grading.grade import grade
from envs.swe.reports.grade_record import Grade

CORPUS = Path(__file__).resolve().parents[3] / "corpus"
DATA = CORPUS / "data"
RUN_ID = "test-corpus"
CI_SUBSET = {
    # kind: instance (the quickest of its project)
    "pytest itself": "pytest-4d4ed42",
    "pluggy (pytest loads it)": "pluggy-7aef3e6",
    "iniconfig (pytest loads it)": "iniconfig-03b7262",
    "packaging (pytest loads it), nox": "packaging-258202e",
    "attrs (installed with pytest)": "attrs-97f8d17",
    "src layout, unittest-only": "tomli-31c85a1",
    "tox, single module": "six-a611f60",
    "conftest.py the tests need": "parso-34b8b7d",
    "doctests": "toolz-5a7e078",
}
FULL_LOG = 20_000_000
H5_KEYS = ("infra_failure", "infra_failure_reason")
"""Fields only 5.x writes (an advisory triage flag): compared apart, the rest must be equal."""


def _rows() -> dict[str, dict]:
    rows = [json.loads(line) for line in (DATA / "corpus.jsonl").read_text().splitlines() if line.strip()]
    return {row["instance_id"].split("-corpus-", 1)[1]: row for row in rows}


ROWS = _rows()
WRONG = {key: text.split("\n", 1)[1] for key, text in json.loads((DATA / "wrong_patches.json").read_text()).items()}
_KNOWN = json.loads((CORPUS / "known_failures.json").read_text())
KNOWN, HANGS = _KNOWN["gold_unresolved"], _KNOWN["grading_hangs"]
_WANTED = os.environ.get("ROLLOUT_CORPUS", "")
NAMES = list(ROWS) if _WANTED == "all" else _WANTED.split(",") if _WANTED else list(CI_SUBSET.values())


def test_the_corpus_is_what_the_readme_says():
    """At least 40 instances over at least 15 projects; every CI instance exists; wrong patches for all."""
    assert len(ROWS) >= 40 and len({row["repo"] for row in ROWS.values()}) >= 15, (len(ROWS), len({
        row["repo"] for row in ROWS.values()}))
    assert set(CI_SUBSET.values()) <= set(ROWS)
    assert set(WRONG) == {row["instance_id"] for row in ROWS.values()}
    assert set(KNOWN) | set(HANGS) <= set(ROWS)
    assert not set(HANGS) & set(CI_SUBSET.values()), "CI would time out"
    readme = (CORPUS / "README.md").read_text()
    for row in ROWS.values():
        assert row["repo"] in readme and row["FAIL_TO_PASS"] and row["repo_path"].endswith(".bundle")


@pytest.fixture(scope="module")
def images(base_image, tmp_path_factory) -> dict[str, str]:
    from envs.images.instance_images import build_instance_images

    # A 5.x row names its image: built here from repo_path as the others are (a named image is never built).
    rows = [{**_built(ROWS[n]), "repo_path": str(DATA / ROWS[n]["repo_path"])} for n in NAMES]
    dataset = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = build_instance_images(dataset, base=base_image, progress=lambda line: None, allow_outside_paths=True)
    assert not report.failed, report.failed
    tags = {n: image_for(_built(ROWS[n]), base_image) for n in NAMES}
    yield tags
    # Only the images this session built: one already there may be another session's, in use.
    built = [tags[n] for n in NAMES if ROWS[n]["instance_id"] in set(report.built)]
    if built:
        subprocess.run(["docker", "rmi", "-f", *built], capture_output=True)


def _built(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "image"}


def graded(row: dict, patch: str | None, image: str) -> Grade:
    from envs.runtimes.docker.runtime import DockerRuntime

    def fresh() -> DockerRuntime:
        return DockerRuntime({"image": image, "workdir": "/testbed"}, run_id=RUN_ID, rollout_id="grade")

    # The whole log, as the harness would read it (by default a long one is kept cut to its ends).
    return asyncio.run(grade(row, patch, fresh, eval_timeout=600, max_log_chars=FULL_LOG))


def theirs_41(row: dict, patch: str | None, log: Path) -> dict:
    from swebench.harness.grading import get_eval_report

    # Only the harness's parser is looked up by repository: pytest's is the one our rows' test_cmd output needs.
    spec = SimpleNamespace(instance_id=row["instance_id"], repo="pytest-dev/pytest", version="5.4",
                           FAIL_TO_PASS=row["FAIL_TO_PASS"], PASS_TO_PASS=row["PASS_TO_PASS"])
    pred = {"instance_id": row["instance_id"], "model_name_or_path": "m", "model_patch": patch}
    return get_eval_report(spec, pred, str(log), include_tests_status=True)


def case_5x(row: dict, patch: str | None, log: str) -> dict:
    """The same log (our test output carries the harness's Start/End Test Output markers, which 5.x requires)."""
    spec = {"instance_id": row["instance_id"], "FAIL_TO_PASS": row["FAIL_TO_PASS"],
            "PASS_TO_PASS": row["PASS_TO_PASS"], "log_parser": row.get("log_parser", "parse_log_pytest"),
            "eval_type": row.get("eval_type", "pass_and_fail")}
    return {"spec": spec, "prediction": {"instance_id": row["instance_id"], "model_name_or_path": "m",
                                         "model_patch": patch},
            "log": log}


@pytest.mark.docker
@pytest.mark.parametrize("name", NAMES)
def test_gold_resolves_empty_and_wrong_do_not_and_reports_equal_the_harnesses(name, images, swebench5, tmp_path):
    if name in HANGS:  # listed with its reason: graded, it never returns (the test would only time out)
        pytest.skip(f"known hang: {HANGS[name]}")
    row = ROWS[name]
    patches = {"gold": row["patch"], "wrong": WRONG[row["instance_id"]], "empty": None}
    grades = {kind: graded(row, patch, images[name]) for kind, patch in patches.items()}
    wrong, empty, gold = grades["wrong"], grades["empty"], grades["gold"]
    assert wrong.patch_successfully_applied and not wrong.resolved, wrong.test_output[-3000:]
    assert wrong.unresolved_reason
    assert empty.patch_is_None and not empty.resolved
    if name in KNOWN:  # where a false alarm fires our report and the harness's part: only the empty patch is compared
        patches = {"empty": None}
    cases, ours = [], []
    for kind, patch in patches.items():
        log = tmp_path / f"{kind}.log"
        log.write_text(grades[kind].test_output)
        report = grades[kind].report()
        if "eval_script" not in row:  # a 5.x-shaped row: 4.x has no such shape
            assert report == theirs_41(row, patch, log), (kind, grades[kind].unresolved_reason)
        ours.append(report)
        cases.append(case_5x(row, patch, grades[kind].test_output))
    for kind, mine, their in zip(patches, ours, swebench5.reports(cases)):
        theirs = their[row["instance_id"]]
        assert theirs.get("infra_failure") in (None, False), (kind, theirs.get("infra_failure_reason"))
        if "eval_script" not in row:  # a 5.x-shaped row's report has these fields too
            for key in H5_KEYS:
                theirs.pop(key, None)
        assert mine == their, (kind, grades[kind].unresolved_reason)
    if name in KNOWN:
        assert not gold.resolved, f"{name} is listed in known_failures.json but its gold patch now resolves"
        pytest.xfail(f"known: {KNOWN[name]}")
    # A project's own runner script gets no canaries (the README's "Runners other than pytest").
    assert gold.resolved and (gold.canaries or "eval_script" in row), (gold.unresolved_reason,
                                                                       gold.test_output[-3000:])
