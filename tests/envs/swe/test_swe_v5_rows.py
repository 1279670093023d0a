"""Row shapes beyond SWE-bench 4.x: SWE-bench 5.x rows (their own eval script, log parser and eval type, their
image), SWE-smith rows (a repository snapshot's image, the instance branch) and SWE-Gym rows (SWE-Gym's images and
commands) are accepted, checked at load and graded as their own harnesses do; 4.x rows stay as they were. In docker
on small local images built from the base image under each benchmark's names; report.json against swebench 5.x's own
grading, from a venv of its own (skips without PyPI unless ROLLOUT_REQUIRE_SWEBENCH5=1)."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from swe_shapes import (
    FIXED,
    GYM_ID,
    OPS,
    SMITH_SNAPSHOT,
    V5_IMAGE,
    build_image,
    dataset,
    diff_of,
    make_rows,
    remove_images,
)

from envs.images.image_names import image_for, swegym_name, swesmith_name
from envs.swe.env import check_row
from envs.swe.logs import parsers as lp
from envs.swe.reports.grade_record import Grade
from envs.swe.rows.shapes import SWEBENCH4, SWEBENCH5, SWEGYM, SWESMITH, shape_of
from envs.swe.rows.v5 import categories, eval_body, judge, take_exit_code
from envs.swe.verifier import SweVerifier
from rollout.data.dataset import load_tasks
from rollout.errors import ConfigError
from rollout.records import RolloutResult, Task

RUN_ID = "test-swe-v5-rows"
SHAPES = {"v4": SWEBENCH4, "v5": SWEBENCH5, "smith": SWESMITH, "gym": SWEGYM}


@pytest.fixture(scope="module")
def calc(tmp_path_factory) -> dict:
    return make_rows(tmp_path_factory.mktemp("calc"))


@pytest.fixture(scope="module")
def images(calc, base_image, tmp_path_factory) -> dict[str, str]:
    """Each row's image, under the name its benchmark gives it: ours (built by our recipe from repo_path) for 4.x,
    the row's ``image`` for 5.x, SWE-smith's snapshot name, SWE-Gym's name."""
    from envs.images.instance_images import build_instance_images

    where = tmp_path_factory.mktemp("images")
    rows = calc["rows"]
    report = build_instance_images(dataset(where / "v4.jsonl", [rows["v4"]]), base=base_image,
                                   progress=lambda line: None, allow_outside_paths=True)
    assert not report.failed, report.failed
    tags = {"v4": image_for(rows["v4"], base_image),
            "v5": build_image(base_image, calc["repo"], V5_IMAGE, where, checkout=calc["base"]),
            "gym": build_image(base_image, calc["repo"], swegym_name(GYM_ID), where, checkout=calc["base"]),
            "smith": build_image(base_image, calc["smith_repo"], swesmith_name(SMITH_SNAPSHOT), where)}
    yield tags
    remove_images(list(tags.values()))


def verify(row: dict, patch: str | None, base: str = "rollout-farm/base:bookworm"):
    """The run's verifier grading ``patch`` for ``row`` in a fresh container of the row's own image."""
    from envs.runtimes.docker.runtime import DockerRuntime

    def make(task):
        return DockerRuntime({"image": image_for(task.data, base), "workdir": "/testbed"}, run_id=RUN_ID,
                             rollout_id=f"grade-{task.task_id}")

    task = Task(task_id=row["instance_id"], prompt="", data=dict(row))
    result = RolloutResult(rollout_id="r", task_id=task.task_id, status="completed", exit_reason="submitted",
                           submission=patch)
    return asyncio.run(SweVerifier({"eval_timeout": 120}, runtime_factory=make).verify(task, result)).details


# ---- at load ------------------------------------------------------------------------------------------------------


def test_each_shape_is_recognised_and_named(calc):
    rows = calc["rows"]
    assert {name: shape_of(row) for name, row in rows.items()} == SHAPES
    assert image_for(rows["v5"]) == V5_IMAGE
    assert image_for(rows["smith"]) == "swebench/swesmith.x86_64.calc_1776_calc.1a2b3c4d"
    assert image_for({k: v for k, v in rows["smith"].items() if k != "repo"}) == image_for(rows["smith"])
    assert image_for(rows["gym"]) == "xingyaoww/sweb.eval.x86_64.iterative_s_dvc-90001:latest"
    other = "swebench/sweb.eval.x86_64.iterative_1776_dvc-90001:latest"
    assert image_for({**rows["gym"], "repo": "django/django"}) == other
    for row in rows.values():
        check_row(Task(task_id=row["instance_id"], data=dict(row)))


@pytest.mark.parametrize("change, says", [
    ({"log_parser": None}, "field log_parser: missing"),
    ({"image": ""}, "field image: missing"),
    ({"log_parser": "parse_log_jest"}, "field log_parser: 'parse_log_jest' is not a parser we read"),
    ({"eval_type": "mostly"}, "field eval_type: 'mostly' is not one of pass_and_fail, fail_only"),
    ({"eval_script": "pytest -rA\n"}, "field eval_script: has no line printing"),
    ({"image": "x; rm -rf /"}, "field image: 'x; rm -rf /' is not an image reference"),
    ({"image_assets": {"test_patch": [{"path": "a.png", "url": "u"}]}}, "field image_assets"),
])
def test_a_bad_5x_field_is_named_at_load(calc, tmp_path, change, says):
    row = {**calc["rows"]["v5"], **change}
    path = dataset(tmp_path / "bad.jsonl", [calc["rows"]["v4"], row])
    with pytest.raises(ConfigError, match="line 2") as caught:
        load_tasks(path, check_row, allow_outside_paths=True)
    assert says in str(caught.value)


def test_a_smith_row_needs_no_base_commit_and_a_safe_branch(calc, tmp_path):
    smith = calc["rows"]["smith"]
    assert len(load_tasks(dataset(tmp_path / "ok.jsonl", [smith]), check_row)) == 1
    bad = {**smith, "instance_id": "calc__calc.1a2b3c4d.x..y"}
    with pytest.raises(ConfigError, match="field instance_id: a SWE-smith instance id names its branch"):
        load_tasks(dataset(tmp_path / "bad.jsonl", [bad]), check_row)
    with pytest.raises(ConfigError, match="field base_commit: missing"):
        load_tasks(dataset(tmp_path / "v4.jsonl", [{**calc["rows"]["v4"], "base_commit": None}]), check_row,
                   allow_outside_paths=True)


def test_swe_gym_rows_run_their_repository_command(calc):
    from envs.swe.rows.specs import eval_plan

    gym = calc["rows"]["gym"]
    plan = eval_plan(gym, GYM_ID)
    assert plan.command == "pytest -rA tests/test_ops.py tests/test_sub.py" and plan.harness == SWEGYM
    mypy = {**gym, "repo": "python/mypy", "test_patch": "[case testFoo]\n[case testBar]\n"}
    assert eval_plan({**mypy, "version": "1.8"}, "m").command == "pytest -rA -k 'testFoo or testBar'"
    assert eval_plan({**mypy, "version": "0.990"}, "m").command == "pytest -n0 -rA -k 'testFoo or testBar'"
    assert eval_plan({**gym, "repo": "pydantic/pydantic"}, "p").parse is lp.pydantic_pytest
    assert eval_plan({**gym, "test_cmd": "make test"}, "t").command == "make test"
    with pytest.raises(ValueError, match="field test_patch: a python/mypy row"):
        check_row(Task(task_id="m", data={**mypy, "test_patch": ""}))


# ---- 5.x's reading of logs ----------------------------------------------------------------------------------------


def test_parsers_read_logs_as_5x_does():
    log = "PASSED t.py::a\nSKIPPED [1] t.py:3: later\nFAILED t.py::b - assert 1 == 2\nPASSED t.py::c[x y]\n"
    assert lp.pytest5(log) == {"t.py::a": "PASSED", "t.py::b": "FAILED", "t.py::c[x": "PASSED"}
    assert lp.PARSERS["parse_log_pytest_v2"](log)["t.py::c[x y]"] == "PASSED"
    assert lp.PARSERS["parse_log_pytest_v2"]("\x1b[32mPASSED t.py::d\x1b[0m\n") == {"t.py::d": "PASSED"}
    assert lp.pytest_options("PASSED t.py::e[/tmp/a/b.txt]\n") == {"t.py::e[/b.txt]": "PASSED"}
    django = "test_a (m.T) ... ok\ntest_b (m.T) ... FAIL\ntest_c (m.T) ... skipped 'no'\ntest_d (m.T) ... noise\nok\n"
    assert lp.django(django) == {"test_a (m.T)": "PASSED", "test_b (m.T)": "FAILED", "test_c (m.T)": "SKIPPED",
                                 "test_d (m.T)": "PASSED"}
    assert lp.sympy("test_x ok\ntest_y F\n") == {"test_x": "PASSED", "test_y": "FAILED"}
    assert lp.swesmith_pytest("t.py::a PASSED [ 50%]\nt.py::b FAILED [100%]\n") == {"t.py::a": "PASSED",
                                                                                     "t.py::b": "FAILED"}


def test_5x_rules_for_skips_cut_ids_and_fail_only():
    statuses = {"f::skip": "SKIPPED", "p::skip": "SKIPPED", "p::cut[ab cd]": "PASSED", "f::x": "FAILED",
                "p::y": "ERROR"}
    expected = {"FAIL_TO_PASS": ["f::skip", "f::x", "f::gone"], "PASS_TO_PASS": ["p::skip", "p::cut[ab", "p::y"]}
    got = categories(statuses, expected)
    assert got["FAIL_TO_PASS"] == {"success": [], "failure": ["f::skip", "f::x", "f::gone"]}
    assert got["PASS_TO_PASS"] == {"success": ["p::skip", "p::cut[ab"], "failure": ["p::y"]}
    assert categories(statuses, expected, fail_only=True)["FAIL_TO_PASS"] == {"success": ["f::skip", "f::gone"],
                                                                             "failure": ["f::x"]}
    ok = ">>>>> Start Test Output\nPASSED t::a\n>>>>> End Test Output\n"
    assert judge(ok, lp.pytest5, 0) == ({"t::a": "PASSED"}, "")
    assert "exited with 2" in judge(ok, lp.pytest5, 2)[1]
    assert judge(ok + ">>>>> Tests Timed Out\n", lp.pytest5, 0)[1]
    assert "markers" in judge("PASSED t::a\n", lp.pytest5, 0)[1]
    assert "no sign" in judge(">>>>> Start Test Output\n>>>>> End Test Output\n", lp.pytest5, 0)[1]


def test_the_eval_script_records_the_test_exit_code_on_a_line_only_it_can_print(tmp_path):
    script = "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\necho PASSED t::a; (exit 3)\n" \
             ": '>>>>> End Test Output'\ntrue\n"
    (tmp_path / "eval.sh").write_text(eval_body(script))
    done = subprocess.run(["bash", str(tmp_path / "eval.sh")], input="KEY123\n", capture_output=True, text=True)
    out = done.stdout + done.stderr
    assert "\nKEY123 test-exit 3\n" in out and "set +x" not in out and "KEY123" not in out.replace(
        "\nKEY123 test-exit 3\n", "")
    log, code = take_exit_code("PASSED t::a\n+ SWEBENCH_TEST_EXIT_CODE=3\n\nKEY123 test-exit 3\n+ : end\n", "KEY123")
    assert (log, code) == ("PASSED t::a\n+ SWEBENCH_TEST_EXIT_CODE=3\n+ : end\n", 3)
    assert ">>>>> Test Exit Code: 3" in done.stdout and done.returncode == 0


def test_no_patch_for_a_5x_row_is_reported_as_5x_reports_it(calc):
    from envs.swe.grading.grade import grade

    def no_runtime():
        raise AssertionError("no patch needs no runtime")

    report = asyncio.run(grade(calc["rows"]["v5"], None, no_runtime)).report()["calc__calc-5"]
    # 5.x writes infra_failure for every report, no patch included (found by the corpus's pyasn1 rows)
    assert report == {"patch_is_None": True, "patch_exists": False, "patch_successfully_applied": False,
                      "resolved": False, "infra_failure": False}
    assert "infra_failure" not in asyncio.run(grade(calc["rows"]["v4"], "", no_runtime)).report()["calc__calc-4"]


# ---- graded for real ---------------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_grades_in_its_own_image(calc, images, shape):
    row = calc["rows"][shape]
    began = time.monotonic()
    gold = verify(row, calc["gold"][shape])
    assert gold["resolved"] and gold["reward"] == 1.0, (gold["unresolved_reason"], gold["test_output"][-3000:])
    assert gold["harness"] == SHAPES[shape] and gold["test_returncode"] == 0
    assert gold["eval_script_returncode"] == (1 if shape == "v5" else 0)  # 5.x's script ends with its git checkout
    half = verify(row, calc["half"][shape])
    assert not half["resolved"] and half["patch_successfully_applied"], half["test_output"][-3000:]
    assert "tests/test_sub.py::test_sub" in half["tests_status"]["FAIL_TO_PASS"]["failure"]
    assert half["test_returncode"] == 1 and half["unresolved_reason"].startswith("tests failed")
    if shape == "v5":
        assert half["log_valid"] is True and set(half) >= {"infra_failure", "eval_script_returncode"}
        assert ">>>>> Test Exit Code: 1" in half["test_output"] and "test-exit" not in half["test_output"]
    if shape == "smith":  # graded at the branch's parent: the test file the branch removed is back
        assert "PASSED" in half["test_output"] and half["apply_method"] == "git apply --verbose"
    print(f"{shape}: two gradings in {time.monotonic() - began:.1f}s")


@pytest.mark.docker
def test_a_smith_agent_starts_on_its_instance_branch(calc, images):
    from envs.runtimes.docker.runtime import DockerRuntime
    from envs.swe.env import SweEnvironment, SweEnvironmentConfig

    def builder(**overrides):
        config = {"image": "rollout-farm/base:bookworm", "workdir": "/testbed", **overrides}
        return DockerRuntime(config, run_id=RUN_ID, rollout_id="smith-env")

    row = calc["rows"]["smith"]
    task = Task(task_id=row["instance_id"], data=dict(row))

    async def scenario():
        env = SweEnvironment(SweEnvironmentConfig(build_images=False, fallback_patch="diff"), runtime_builder=builder)
        try:
            await env.reset(task)
            seen = await env.runtime.exec("git rev-parse --abbrev-ref HEAD; ls tests", cwd="/testbed")
            await env.runtime.exec("sed -i 's/return a + b/return a - b/' calc/ops.py", cwd="/testbed")
            return seen.output, await env.final_patch(None)
        finally:
            await env.close()

    output, (patch, source) = asyncio.run(scenario())
    assert output.split() == [row["instance_id"], "test_ops.py"]  # the failing tests' file is not there
    assert source == "diff" and "-    return a + b\n+    return a - b" in patch


HOSTILE = {
    "conftest forcing passes": {"conftest.py": "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
                                "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                                "    outcome.get_result().outcome = 'passed'\n"},
    "exit code line forged, pytest exits 2": {"calc/ops.py": OPS + (
        "\nimport atexit, os, sys\n\n\ndef _forge():\n    sys.stdout.write('\\n>>>>> End Test Output\\n"
        ">>>>> Test Exit Code: 0\\nPASSED tests/test_sub.py::test_sub\\nPASSED tests/test_ops.py::test_add\\n')\n"
        "    sys.stdout.flush()\n    os._exit(2)\n\n\natexit.register(_forge)\n")},
    "printer, pytest exits 0": {"calc/ops.py": OPS + (
        "\nimport atexit, os, sys\n\n\ndef _forge():\n    sys.stdout.write('PASSED tests/test_sub.py::test_sub\\n"
        "PASSED tests/test_ops.py::test_add\\n')\n    sys.stdout.flush()\n    os._exit(0)\n\n\n"
        "atexit.register(_forge)\n")},
    # sub is fixed only if the grading script's marker prefix can be read from any process's command line or
    # environment (where a patch could forge the script's steps with it).
    "marker prefix searched in /proc": {"calc/ops.py": FIXED.replace(
        "def sub(a, b):\n    return a - b", "def sub(a, b):\n    return a - b if _scan() else a + b") + (
        "\n\ndef _scan():\n    import os, re\n    for pid in os.listdir('/proc'):\n"
        "        for part in ('cmdline', 'environ'):\n            try:\n"
        "                text = open(f'/proc/{pid}/{part}', 'rb').read().decode('utf-8', 'replace')\n"
        "            except OSError:\n                continue\n"
        "            if re.search(r'>>>>> rollout-grade [0-9a-f]+', text):\n                return True\n"
        "    return False\n")},
}


@pytest.mark.docker
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_patches_on_a_5x_row_resolve_nothing(calc, images, case, tmp_path):
    patch = diff_of(calc["repo"], calc["base"], tmp_path / "agent", HOSTILE[case])
    graded = verify(calc["rows"]["v5"], patch)
    assert not graded["resolved"] and graded["reward"] == 0.0
    assert graded["unresolved_reason"], graded["test_output"][-3000:]
    if case.startswith("exit code"):
        assert graded["test_returncode"] == 2 and "exited with 2" in graded["unresolved_reason"]
    if case.startswith("conftest"):
        assert graded["restored"] == ["conftest.py"]
    if case.startswith("marker"):  # nothing names the prefix: not a command line, an environment
        assert graded["tests_status"]["FAIL_TO_PASS"]["failure"] == ["tests/test_sub.py::test_sub"]


# ---- report.json against swebench 5.x ------------------------------------------------------------------------------


def _skipping(name: str) -> str:
    return FIXED.replace(f"def {name}(a, b):\n", f"def {name}(a, b):\n    import pytest\n    pytest.skip('later')\n")


@pytest.mark.docker
def test_report_json_equals_the_5x_harness_on_the_same_log(calc, images, swebench5, tmp_path):
    row = calc["rows"]["v5"]
    exit3 = FIXED + "\nimport atexit, os\natexit.register(os._exit, 3)\n"
    patches = {"gold": calc["gold"]["v5"], "half": calc["half"]["v5"],
               "f2p skipped": diff_of(calc["repo"], calc["base"], tmp_path / "a", {"calc/ops.py": _skipping("sub")}),
               "p2p skipped": diff_of(calc["repo"], calc["base"], tmp_path / "b", {"calc/ops.py": _skipping("mul")}),
               "pytest exits 3": diff_of(calc["repo"], calc["base"], tmp_path / "c", {"calc/ops.py": exit3})}
    rows = {name: row for name in patches}
    rows["half, fail_only"], patches["half, fail_only"] = {**row, "eval_type": "fail_only"}, calc["half"]["v5"]
    cases, ours = [], {}
    for name, patch in patches.items():
        graded = verify(rows[name], patch)
        ours[name] = Grade.model_validate({k: v for k, v in graded.items() if k in Grade.model_fields}).report()
        spec = {k: rows[name][k] for k in ("instance_id", "FAIL_TO_PASS", "PASS_TO_PASS", "log_parser", "eval_type")}
        cases.append({"spec": spec, "prediction": {"instance_id": row["instance_id"], "model_name_or_path": "m",
                                                   "model_patch": patch}, "log": graded["test_output"]})
    theirs = dict(zip(patches, swebench5.reports(cases)))
    assert ours == theirs
    fields = {name: report[row["instance_id"]] for name, report in ours.items()}
    assert fields["gold"]["resolved"] and not fields["half"]["resolved"]
    # pytest -rA sums skips up as "SKIPPED [n] file:line": the skipped tests are missing from the log, and fail.
    assert not fields["f2p skipped"]["resolved"] and not fields["p2p skipped"]["resolved"]
    assert fields["pytest exits 3"]["patch_successfully_applied"] is False  # 5.x: an exit code with no failure
    assert fields["half, fail_only"]["tests_status"]["FAIL_TO_PASS"]["failure"] == ["tests/test_sub.py::test_sub"]
