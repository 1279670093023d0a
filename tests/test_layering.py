"""The layers hold: rollout/ (the core) imports nothing from envs, agents, cluster or ray, directly or by a string
naming a module; envs and agents never import each other; only cluster/ imports ray."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollout", "agents", "envs", "cluster")
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


def test_every_file_is_named_in_its_folders_readme():
    """Each folder's README (or, for a small subfolder, its parent's) names every module in it."""
    missing = []
    for package in PACKAGES:
        for folder in [ROOT / package, *[p for p in (ROOT / package).rglob("*") if p.is_dir()]]:
            text = "".join((d / "README.md").read_text() for d in (folder, folder.parent) if (d / "README.md").exists())
            missing += [f"{path.relative_to(ROOT)}" for path in folder.glob("*.py") if path.name != "__init__.py"
                        and not re.search(rf"\b{re.escape(path.stem)}\b", text)]
    assert missing == []
