"""The code's own style, held by a linter rather than by review: lines of at most 120 characters, imports sorted
(standard library, third party, this project), and none of pyflakes' mistakes (``[tool.ruff]`` in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e '.[dev]'")
    return [found]


def test_the_code_passes_the_linter():
    out = subprocess.run([*ruff(), "check", "--no-cache", "rollout", "envs", "agents", "cluster", "examples",
                          "tests"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_linter_sees_a_long_line(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("X = " + repr("x" * 130) + "\n")
    out = subprocess.run([*ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(probe)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "E501" in out.stdout, out.stdout + out.stderr
