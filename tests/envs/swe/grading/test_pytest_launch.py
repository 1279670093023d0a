"""The grading launcher on a small repository, through the same shell functions and snapshot the grading script
uses: what the repository had before the "patch" (its own plugin, its configuration) still works; what was added
after it does not."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.swe.grading.pytest_launch import boot_files, exports, grading_mode, launcher, mode_path, snapshot_function

PLUGIN = 'print("PLUGIN {name} LOADED")\n'


def write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def graded_pytest(tmp_path: Path, base: dict[str, str], patch: dict[str, str], command: str) -> str:
    """The output of ``command`` run as the grading script runs the tests: the snapshot taken on ``base``, then the
    ``patch`` files written, then the command with the launcher's functions in place."""
    repo, scratch = tmp_path / "repo", tmp_path / "scratch"
    write(repo, base)
    write(scratch, {"launch.py": launcher(), **{f"boot/{n}": t for n, t in boot_files().items()}})
    script = "\n".join([f"S={scratch}", snapshot_function(), "snapshot || exit 9", "echo snapshot-taken",
                        "read -r _", exports(str(scratch), "t1"), command])
    proc = subprocess.Popen(["bash", "-c", script], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert proc.stdout.readline().strip() == "snapshot-taken"
    write(repo, patch)  # after the snapshot, as the patch comes after it in grading
    out, _ = proc.communicate("go\n", timeout=120)
    return out


BASE = {
    "own-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: own\nVersion: 1.0\n",
    "own-1.0.dist-info/entry_points.txt": "[pytest11]\nown = ownplug\n",
    "ownplug.py": PLUGIN.format(name="OWN"),
    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\n',
    "src/lib.py": "VALUE = 3\n",
    "tests/test_lib.py": "import lib\n\n\ndef test_value():\n    assert lib.VALUE == 3\n",
}


def test_what_the_repository_had_works_and_what_the_patch_added_does_not(tmp_path):
    patch = {
        "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evilplug\n",
        "evilplug.py": PLUGIN.format(name="EVIL"),
        "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\naddopts = "-p evilplug"\n',
        "tests/pytest.ini": "[pytest]\naddopts = -p evilplug\n",
        "pytest.py": 'print("SHADOW PYTEST RAN")\n',
        "iniconfig.py": 'print("SHADOW INICONFIG RAN")\n',  # pytest imports it at start: the patch's is not it
        "pluggy/__init__.py": 'print("SHADOW PLUGGY RAN")\n',
    }
    out = graded_pytest(tmp_path, BASE, patch, "python3 -m pytest -rA tests/test_lib.py")
    assert "PLUGIN OWN LOADED" in out  # the project's own plugin, registered before the patch, still loads
    assert "EVIL" not in out and "SHADOW" not in out, out
    assert "PASSED tests/test_lib.py::test_value" in out, out  # pythonpath = src, relative to the base file
    assert grading_mode((tmp_path / "scratch" / "mode").read_text()) == ("isolated", [])


def test_the_script_form_and_a_changed_plugin_registration(tmp_path):
    """`pytest` (the script) is caught too; the repository's own metadata changed by the patch is not read."""
    patch = {"own-1.0.dist-info/entry_points.txt": "[pytest11]\nown = evilplug\n",
             "evilplug.py": PLUGIN.format(name="EVIL")}
    out = graded_pytest(tmp_path, BASE, patch, "pytest -rA tests/test_lib.py")
    assert "EVIL" not in out and "PLUGIN OWN" not in out, out
    assert "PASSED tests/test_lib.py::test_value" in out, out


def installed(*names: str) -> dict[str, str]:
    """The installed source of the top-level modules ``names`` (as this environment's pytest imports them), by
    path relative to their site directory, each package's ``__init__.py`` marking itself as the repository's."""
    files = {}
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec.submodule_search_locations:
            root = Path(spec.origin).parent
            for path in sorted(root.rglob("*.py")):
                files[f"{name}/{path.relative_to(root)}"] = path.read_text()
            files[f"{name}/__init__.py"] += "\nFROM_REPOSITORY = True\n"
        else:
            files[f"{name}.py"] = Path(spec.origin).read_text() + "\nFROM_REPOSITORY = True\n"
    return files


@pytest.mark.parametrize("layout", ["root", "src"])
@pytest.mark.parametrize("name", ["iniconfig", "pluggy"])
def test_a_repository_that_pytest_loads_is_the_copy_its_tests_import(tmp_path, name, layout):
    """The repository under test is a package pytest itself imports at start-up: its tests import the
    repository's copy, with the patch's fix in it (never the copy the image installed for pytest), as the
    harness's own command does; the grading mode says so."""
    prefix, command = ("", "python3 -m pytest") if layout == "root" else ("src/", "PYTHONPATH=src python3 -m pytest")
    own = {prefix + path: text for path, text in installed(name).items()}
    base = {**own, "tests/test_own.py": f"import {name}\n\n\ndef test_fixed():\n"
                                        f"    assert {name}.FROM_REPOSITORY and getattr({name}, 'FIXED', False)\n"}
    init = f"{prefix}{name}/__init__.py"
    patch = {init: own[init] + "FIXED = True\n"}  # the fix, in the repository's module
    out = graded_pytest(tmp_path, base, patch, f"{command} -rA tests/test_own.py")
    assert "PASSED tests/test_own.py::test_fixed" in out, out
    assert grading_mode((tmp_path / "scratch" / "mode").read_text()) == ("harness", [name])


def test_the_repository_is_pytest_itself(tmp_path):
    """pytest's own repository (SWE-bench grades it): its tests run under the repository's pytest, patched."""
    own = {"src/" + path: text for path, text in installed("pytest", "_pytest").items()}
    base = {**own, "testing/test_own.py": "import pytest\n\n\ndef test_fixed():\n"
                                          "    assert pytest.FROM_REPOSITORY and pytest.FIXED\n"}
    patch = {"src/pytest/__init__.py": own["src/pytest/__init__.py"] + "FIXED = True\n"}
    out = graded_pytest(tmp_path, base, patch, "PYTHONPATH=src python3 -m pytest -rA testing/test_own.py")
    assert "PASSED testing/test_own.py::test_fixed" in out, out
    mode, modules = grading_mode((tmp_path / "scratch" / "mode").read_text())
    assert mode == "harness" and {"pytest", "_pytest"} <= set(modules), modules


def test_the_grading_mode_of_several_runs():
    assert grading_mode("isolated\nisolated\n") == ("isolated", [])
    assert grading_mode("isolated\nharness pluggy\n") == ("harness", ["pluggy"])
    assert grading_mode("") == ("harness", [])  # no pytest run went through the launcher: the command as given
    assert mode_path("/tmp/s") == "/tmp/s/mode"


def test_the_launcher_runs_on_the_pythons_benchmark_images_have():
    """It runs under the image's interpreter, which for older repositories is as old as Python 3.6."""
    import ast

    from envs.swe.grading.pytest_launch import launcher

    ast.parse(launcher(), feature_version=(3, 6))
    assert "import " not in "".join(line for line in launcher().splitlines() if line.startswith(("from envs",
                                                                                                 "import envs")))


def test_unittest_runs_the_standard_librarys_runner_and_the_repositorys_code(tmp_path):
    """`python -m unittest`: a `unittest` package the patch adds at the repository's root (which `-m` would put
    first) does not stand in for the standard library's, and the code under test is the patched repository's."""
    base = {"lib.py": "VALUE = 3\n",
            "tests/__init__.py": "",
            "tests/test_lib.py": "import unittest\n\nimport lib\n\n\nclass TestLib(unittest.TestCase):\n"
                                 "    def test_value(self):\n        self.assertEqual(lib.VALUE, 4)\n"}
    patch = {"lib.py": "VALUE = 4\n",
             "unittest/__init__.py": "print('SHADOW UNITTEST RAN')\n",
             "unittest/__main__.py": "print('SHADOW UNITTEST RAN')\n"}
    out = graded_pytest(tmp_path, base, patch, "python3 -m unittest -v tests.test_lib; echo EXIT=$?")
    assert "SHADOW" not in out, out
    assert "test_value (tests.test_lib.TestLib" in out and "ok" in out and "EXIT=0" in out, out
    assert grading_mode((tmp_path / "scratch" / "mode").read_text()) == ("isolated", [])
