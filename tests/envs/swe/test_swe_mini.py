"""The bundled mini SWE benchmark: bundles at fixed commits, FAIL_TO_PASS found by running the tests, loud failures."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envs.swe.logs.pytest_log import PASSING, parse_log_pytest
from envs.swe.mini import DATA_DIR, build, instance_names
from rollout.data.dataset import load_tasks
from rollout.errors import ConfigError

SMALL = "rle"  # a small instance for the tests that build again


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The whole benchmark, built once: (dataset path, rows by instance directory name)."""
    path = build(tmp_path_factory.mktemp("swe_mini"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return path, {Path(r["repo_path"]).stem: r for r in rows}


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_tests(row, checkout):
    ran = subprocess.run(["bash", "-c", row["test_cmd"]], check=False, cwd=checkout, capture_output=True, text=True,
                         env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
                              "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # as in the image: no host plugins
    return parse_log_pytest(ran.stdout)


def test_every_instance_has_failing_then_passing_tests(built):
    path, rows = built
    assert len(rows) >= 10 and sorted(rows) == instance_names()
    for name, row in rows.items():
        assert row["instance_id"] == f"mini__{name}-1" and row["repo"] == f"mini/{name}"
        assert len(row["base_commit"]) == 40 and row["version"] == "0.1"
        assert row["patch"].startswith("diff --git") and row["test_patch"].startswith("diff --git")
        assert row["FAIL_TO_PASS"] and row["PASS_TO_PASS"], name
        assert not set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"])
        assert all(t.startswith("tests/test_") and "::" in t for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"])
        assert (path.parent / row["repo_path"]).is_file()
    # SWE-bench rows load as tasks whose data holds the fields environments and graders read.
    tasks = {t.task_id: t for t in load_tasks(path)}
    assert tasks["mini__roman-1"].prompt.startswith("from_roman accepts malformed numerals")
    assert tasks["mini__roman-1"].data["FAIL_TO_PASS"] == rows["roman"]["FAIL_TO_PASS"]


def test_ids_are_read_the_way_the_harness_reads_them(built):
    _, rows = built
    p2p = rows["slugify"]["PASS_TO_PASS"]
    # A class, brackets inside brackets, and an id with a space (cut at the space, as the harness does).
    assert "tests/test_slugify.py::TestUniqueSlug::test_free_slug_is_kept" in p2p
    assert "tests/test_slugify.py::test_spaces_and_brackets_become_separators[x[y]]" in p2p
    assert "tests/test_slugify.py::test_spaces_and_brackets_become_separators[a" in p2p
    assert not any("cyrillic" in t for t in p2p + rows["slugify"]["FAIL_TO_PASS"])  # skipped: neither list
    assert "tests/test_ops.py::test_non_square_products[2x3" in rows["matrix"]["FAIL_TO_PASS"]


@pytest.mark.parametrize("name", ["intervals", "matrix"])  # one src/ layout, one top-level package
def test_bundle_clones_at_base_and_the_gold_patch_fixes_it(built, tmp_path, name):
    path, rows = built
    row = rows[name]
    checkout = tmp_path / "testbed"
    git(tmp_path, "clone", "-q", str(path.parent / row["repo_path"]), str(checkout))
    git(checkout, "checkout", "-q", row["base_commit"])
    assert git(checkout, "rev-list", "--all", "--count") == "1"  # no future history in the bundle
    (tmp_path / "test.patch").write_text(row["test_patch"])
    (tmp_path / "gold.patch").write_text(row["patch"])
    git(checkout, "apply", str(tmp_path / "test.patch"))
    before = run_tests(row, checkout)
    assert not any(before.get(t) in PASSING for t in row["FAIL_TO_PASS"])
    assert all(before[t] == "PASSED" for t in row["PASS_TO_PASS"])
    git(checkout, "apply", str(tmp_path / "gold.patch"))
    after = run_tests(row, checkout)
    assert all(after[t] == "PASSED" for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"])


def copy_instance(tmp_path, name=SMALL):
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR / name, data / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return data


def test_base_commits_are_the_same_in_every_build(built, tmp_path):
    _, rows = built
    data = copy_instance(tmp_path)
    (data / SMALL / "repo" / "README.md").chmod(0o755)  # a checkout's file modes must not matter
    out = subprocess.run([sys.executable, "-m", "envs.swe.mini", str(tmp_path / "out"), "--only", SMALL],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == str(tmp_path / "out" / "swe_mini.jsonl")
    again = json.loads(build(tmp_path / "again", data_dir=data).read_text())
    first = json.loads((tmp_path / "out" / "swe_mini.jsonl").read_text())
    assert first["base_commit"] == again["base_commit"] == rows[SMALL]["base_commit"]
    assert first == again == rows[SMALL]


def test_unchanged_inputs_are_reused_and_changed_ones_rebuilt(tmp_path):
    data = copy_instance(tmp_path)
    out = tmp_path / "out"
    build(out, data_dir=data)
    bundle = out / "repos" / f"{SMALL}.bundle"
    stamp = bundle.stat().st_mtime_ns
    build(out, data_dir=data)
    assert bundle.stat().st_mtime_ns == stamp
    source = data / SMALL / "repo" / "runlength" / "codec.py"
    source.write_text(source.read_text() + "\n\ndef version():\n    return 2\n")
    row = json.loads(build(out, data_dir=data).read_text())
    assert bundle.stat().st_mtime_ns != stamp
    assert git(tmp_path, "bundle", "list-heads", str(bundle)).startswith(row["base_commit"])


def edit_gold(instance, old, new):
    gold = instance / "gold.patch"
    assert old in gold.read_text()
    gold.write_text(gold.read_text().replace(old, new, 1))


def break_gold_context(instance):
    edit_gold(instance, "     for ch in data:", "     for char in data:")


def gold_fixes_nothing(instance):
    edit_gold(instance, "+            count += ch", "+            count = ch")


def gold_touches_tests(instance):
    (instance / "gold.patch").write_text((instance / "test.patch").read_text())


@pytest.mark.parametrize(
    "breakage, message",
    [
        (break_gold_context, "gold.patch does not apply cleanly"),
        (gold_fixes_nothing, "no test fails before the gold patch and passes after"),
        (gold_touches_tests, "test files in the patch: tests/test_codec.py"),
    ],
    ids=["gold does not apply", "no FAIL_TO_PASS", "gold edits tests"],
)
def test_broken_instances_fail_loudly_and_write_nothing(tmp_path, breakage, message):
    data = copy_instance(tmp_path)
    breakage(data / SMALL)
    with pytest.raises(ConfigError, match=message) as info:
        build(tmp_path / "out", data_dir=data)
    assert SMALL in info.value.field
    assert not (tmp_path / "out" / "swe_mini.jsonl").exists()
    assert not (tmp_path / "out" / "repos" / f"{SMALL}.bundle").exists()


def test_unknown_instance_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown instances"):
        build(tmp_path, names=["no-such-repo"])
