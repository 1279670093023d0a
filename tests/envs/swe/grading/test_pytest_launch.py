"""The grading launcher on a small repository, through the same shell functions and snapshot the grading script
uses: what the repository had before the "patch" (its own plugin, its configuration) still works; what was added
after it does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from envs.swe.grading.pytest_launch import boot_files, exports, launcher, snapshot_function

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
    }
    out = graded_pytest(tmp_path, BASE, patch, "python3 -m pytest -rA tests/test_lib.py")
    assert "PLUGIN OWN LOADED" in out  # the project's own plugin, registered before the patch, still loads
    assert "EVIL" not in out and "SHADOW" not in out, out
    assert "PASSED tests/test_lib.py::test_value" in out, out  # pythonpath = src, relative to the base file


def test_the_script_form_and_a_changed_plugin_registration(tmp_path):
    """`pytest` (the script) is caught too; the repository's own metadata changed by the patch is not read."""
    patch = {"own-1.0.dist-info/entry_points.txt": "[pytest11]\nown = evilplug\n",
             "evilplug.py": PLUGIN.format(name="EVIL")}
    out = graded_pytest(tmp_path, BASE, patch, "pytest -rA tests/test_lib.py")
    assert "EVIL" not in out and "PLUGIN OWN" not in out, out
    assert "PASSED tests/test_lib.py::test_value" in out, out


def test_the_launcher_runs_on_the_pythons_benchmark_images_have():
    """It runs under the image's interpreter, which for older repositories is as old as Python 3.6."""
    import ast

    from envs.swe.grading.pytest_launch import launcher

    ast.parse(launcher(), feature_version=(3, 6))
    assert "import " not in "".join(line for line in launcher().splitlines() if line.startswith(("from envs",
                                                                                                 "import envs")))
