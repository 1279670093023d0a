"""The import names resolve to this repository, and the pure packages never pull in ray."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["rollout", "envs", "agents", "cluster"])
def test_package_resolves_to_this_repository(name):
    # other PyPI distributions use these import names (the OpenAI Agents SDK imports as `agents`)
    module = __import__(name)
    assert Path(module.__file__).resolve().parent == REPO / name


def test_pure_packages_do_not_import_ray_and_import_silently():
    code = (
        "import sys, importlib, pkgutil\n"
        "for pkg in ('rollout', 'envs', 'agents'):\n"
        "    m = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(m.__path__, pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "assert 'ray' not in sys.modules, [k for k in sys.modules if k.startswith('ray')]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == "", "importing the packages must print nothing"


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'rollout = "cluster.cli.main:main"' in text
    for extra in ("dev", "docker", "ray", "gpu", "cpu-llm"):
        assert f"\n{extra} = [" in text


def test_every_subpackage_is_listed_for_the_wheel():
    # setuptools is given the list explicitly (other distributions share these import names): a folder
    # missing from it would work in a source checkout and be absent from a wheel
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(REPO).parts) for name in ("rollout", "envs", "agents", "cluster")
             for init in (REPO / name).rglob("__init__.py")}
    assert listed == found, (sorted(found - listed), sorted(listed - found))
