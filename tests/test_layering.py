"""The layers hold: rollout/ (the core) imports nothing from envs, agents, cluster or ray, directly or by a string
naming a module; envs and agents never import each other; only cluster/ imports ray. And the folders stay readable:
each README names every module of its folder and no module that is gone, no folder holds more than 12 modules, no
module is over 250 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollout", "agents", "envs", "cluster")
SIZED = (*PACKAGES, "examples", "tests")  # package folders whose size is capped (modules per folder)
MAX_MODULES_PER_FOLDER = 12  # __init__.py counts
MAX_LINES_PER_MODULE = 250
RUNTIME_SCRIPTS = {"envs/swe/grading/pytest_launcher.py", "envs/swe/grading/twin_maker.py"}
"""Never imported: each is copied whole, as text, into a grading runtime and run there as one self-contained
script (standard library only), so it is one file by necessity, not a module to cut by length."""
MODULE_STRING = re.compile(r"^(?P<top>envs|agents|cluster|ray)(\.[A-Za-z_][\w.]*)?(:\w+)?$")


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imports_of(path: Path) -> list[tuple[str, int, str]]:
    """(top-level module, line, how) for every import and every string constant that names a module path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno, "import") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, "import"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_STRING.match(node.value)
            if match and ("." in node.value or ":" in node.value):
                found.append((match["top"], node.lineno, f"string {node.value!r}"))
    return found


def offences(package: str, forbidden: set[str]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {how} ({top})" for path in sources(package)
            for top, line, how in imports_of(path) if top in forbidden]


@pytest.mark.parametrize("package, forbidden", [
    ("rollout", {"envs", "agents", "cluster", "ray"}),
    ("envs", {"agents", "cluster", "ray"}),
    ("agents", {"envs", "cluster", "ray"}),
])
def test_a_lower_layer_never_reaches_up(package, forbidden):
    assert sources(package), f"no sources under {package}/"
    assert offences(package, forbidden) == []


def test_only_cluster_imports_ray():
    users = {path.relative_to(ROOT).parts[0] for package in PACKAGES for path in sources(package)
             if any(top == "ray" and how == "import" for top, _line, how in imports_of(path))}
    assert users <= {"cluster"}, users
    assert "cluster" in users  # the check looks at real imports: the farm does import ray


def test_the_checker_sees_imports_and_module_strings(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import envs.runtimes.docker.runtime\nfrom agents import x\nPATH = "cluster.run.job:prepare"\n'
                     'TEXT = "agents are strategies"\n')
    assert [(top, how.split()[0]) for top, _line, how in imports_of(probe)] == [
        ("envs", "import"), ("agents", "import"), ("cluster", "string")]


def folders(top: str) -> list[Path]:
    """``top`` and every folder under it, without caches and hidden folders."""
    below = [path for path in (ROOT / top).rglob("*") if path.is_dir()]
    hidden = (".", "__pycache__")
    return [ROOT / top, *sorted(path for path in below
                                if not any(part.startswith(hidden) for part in path.relative_to(ROOT).parts))]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_file_is_named_in_its_folders_readme(package):
    """Each folder's README (or, for a small subfolder, its parent's) names every module in it."""
    missing = []
    for folder in folders(package):
        text = "".join((d / "README.md").read_text() for d in (folder, folder.parent) if (d / "README.md").exists())
        missing += [f"{path.relative_to(ROOT)}" for path in folder.glob("*.py") if path.name != "__init__.py"
                    and not re.search(rf"\b{re.escape(path.stem)}\b", text)]
    assert missing == []


PY_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)*\w+\.py)\b")
FOREIGN = {"conftest.py", "setup.py", "sitecustomize.py", "usercustomize.py"}  # files of the repositories we grade


def exists_from(folder: Path, name: str) -> bool:
    return ((folder / name).exists() or (ROOT / name).exists()
            or ("/" not in name and any(folder.rglob(name))))


@pytest.mark.parametrize("package", [*PACKAGES, "tests"])
def test_readmes_name_no_module_that_is_gone(package):
    """A ``name.py`` a README mentions exists: beside the README, under it, or as a path from the repository root."""
    stale = []
    for folder in folders(package):
        readme = folder / "README.md"
        if not readme.exists():
            continue
        for number, line in enumerate(readme.read_text().splitlines(), 1):
            stale += [f"{readme.relative_to(ROOT)}:{number}: {name}" for name in PY_NAME.findall(line)
                      if name not in FOREIGN and not exists_from(folder, name)]
    assert stale == []


def test_no_folder_holds_more_than_12_modules():
    crowded = {f"{folder.relative_to(ROOT)}/": count for top in SIZED for folder in folders(top)
               if (count := len(list(folder.glob("*.py")))) > MAX_MODULES_PER_FOLDER}
    assert crowded == {}, f"split these folders along a seam (at most {MAX_MODULES_PER_FOLDER} modules each)"


def test_no_module_is_over_250_lines():
    long = {f"{path.relative_to(ROOT)}": lines for top in SIZED if top != "tests" for folder in folders(top)
            for path in folder.glob("*.py") if (lines := len(path.read_text().splitlines())) > MAX_LINES_PER_MODULE
            and str(path.relative_to(ROOT)) not in RUNTIME_SCRIPTS}
    assert long == {}, f"split these modules along a seam (at most {MAX_LINES_PER_MODULE} lines each)"


@pytest.mark.parametrize("folder, forbidden", [
    ("envs/swe/logs", ("envs.swe.rows", "envs.swe.grading", "envs.swe.reports")),
    ("envs/swe/rows", ("envs.swe.grading", "envs.swe.reports")),
    ("envs/swe/reports", ("envs.swe.grading",)),
    ("envs/runtimes/docker", ("envs.runtimes.apptainer",)),
    ("envs/runtimes/apptainer", ("envs.runtimes.docker",)),
    ("cluster/session", ("cluster.run", "cluster.farm", "cluster.cli", "cluster.serving", "cluster.workers")),
    ("cluster/workers", ("cluster.run", "cluster.farm", "cluster.cli", "cluster.assembly")),
    ("cluster/placement", ("cluster.run", "cluster.farm", "cluster.cli", "cluster.assembly", "cluster.workers",
                           "cluster.serving", "cluster.backends", "cluster.transfer", "ray")),
    ("cluster/transfer", ("cluster.run", "cluster.farm", "cluster.cli", "cluster.assembly", "cluster.workers",
                          "cluster.serving", "cluster.backends")),
])
def test_subfolders_import_one_way(folder, forbidden):
    """Inside a package the parts point one way too: a lower part never imports one that builds on it (the
    grader reads rows, logs and reports; none of them reads the grader back)."""
    names = re.compile(r"^\s*(?:from|import)\s+(" + "|".join(re.escape(f) for f in forbidden) + r")\b", re.M)
    found = [f"{path.relative_to(ROOT)}: {match}" for path in sorted((ROOT / folder).rglob("*.py"))
             for match in names.findall(path.read_text())]
    assert found == []
