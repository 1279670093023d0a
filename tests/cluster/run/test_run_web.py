"""What ``rollout run`` shows a person: the live page while it runs (``--web``), ``report.html`` and
``summary.png`` at the end named in the summary, and the Ray dashboard's URL with how to sign in, printed once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def rollout(tmp_path, *args, timeout=300):
    env = {**os.environ, "ROLLOUT_HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "cluster", "run", str(ROOT / "configs" / "local_demo.yaml"),
                           *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_a_run_with_web_serves_its_page_and_ends_with_the_report_named_in_the_summary(tmp_path):
    out = rollout(tmp_path, "--local", "--web", "run_id=web-run", "output.dir=web-run")
    assert out.returncode == 0, out.stderr
    pages = re.findall(r"^live page: (http://127\.0\.0\.1:\d+/\S*)$", out.stderr, re.M)
    assert len(pages) == 1, out.stderr
    run_dir = tmp_path / "web-run"
    html, png = run_dir / "report.html", run_dir / "summary.png"
    assert html.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report_row = next(line for line in out.stdout.splitlines() if line.startswith("report"))
    assert str(html) in report_row and str(png) in report_row


@pytest.mark.ray
@pytest.mark.slow
def test_the_dashboard_url_and_how_to_sign_in_are_printed_once(tmp_path):
    out = rollout(tmp_path, "farm.dashboard=true", "run_id=dash-run", "output.dir=dash-run", "dataset.slice=0:2")
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    hints = [line for line in text.splitlines() if line.startswith("ray dashboard: ")]
    assert len(hints) == 1, text
    assert re.search(r"http://[\d.]+:\d+", hints[0])
    assert "token" in hints[0] and ("ray get-auth-token" in hints[0] or "token authentication is off" in hints[0])
