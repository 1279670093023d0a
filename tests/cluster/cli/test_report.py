"""The plots at the end of a run: ``rollout report RUN`` on a real run (passes, fails, an infrastructure failure)
writes report.html, which headless Chromium (Debian's ``chromium``) renders with its charts and nothing fetched, and
summary.png, a valid 1500x900 image with its six panels; a SWE run's last panel is resolved by instance; without
matplotlib, report.html still comes and the missing package is named. The browser check skips without chromium
unless ``ROLLOUT_REQUIRE_CHROMIUM=1`` (as in CI)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
POLICY = textwrap.dedent('''
    """Scripted policy for the report's tests: ``turns`` commands, then submit; a "broken" task gets no text."""
    from rollout.models.policies import SUBMIT_SENTINEL


    def turns(messages, ctx):
        data = ctx.task.data if ctx.task is not None else {}
        if data.get("broken"):
            return 42  # not a reply: the scripted model fails, an infrastructure failure (ModelError)
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        if turn <= int(data.get("turns", 1)):
            return f"Turn {turn}.\\n```bash\\necho turn {turn}\\n```"
        return f"Done.\\n```bash\\necho {SUBMIT_SENTINEL}\\n```"
''')
PANELS = ["reward distribution", "rollout duration distribution", "turns per rollout", "outcomes",
          "infrastructure failures by type"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("ROLLOUT_REQUIRE_CHROMIUM", "") not in ("", "0", "false", "no"):
        pytest.fail("ROLLOUT_REQUIRE_CHROMIUM is set but chromium is not installed")
    pytest.skip("chromium is not installed (apt-get install chromium; ROLLOUT_REQUIRE_CHROMIUM=1 makes this an error)")


def env(home: Path, *first: Path) -> dict:
    return {**os.environ, "ROLLOUT_HOME": str(home), "PYTHONPATH": os.pathsep.join([*map(str, first), str(home),
                                                                                      str(REPO)])}


def rollout(home: Path, *args: str, path: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster", *args], env=env(home, *path), cwd=REPO,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture
def finished_run(tmp_path) -> Path:
    """A run of 7 rollouts: 4 pass, 2 fail their check (reward 0), 1 fails on infrastructure (ModelError)."""
    (tmp_path / "report_policies.py").write_text(POLICY)
    rows = [{"task_id": f"t{i}", "prompt": "Run the commands, then submit.",
             "data": {"turns": i % 4, "check": "true" if i < 4 else "false"}} for i in range(6)]
    rows.append({"task_id": "broken", "prompt": "Nothing works.", "data": {"broken": True, "check": "true"}})
    data = tmp_path / "report.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "run_id": "reported", "model": {"type": "scripted", "policy": "report_policies:turns"},
        "agent": {"type": "mini_swe", "max_steps": 10}, "environment": {"type": "shell", "command_timeout": 30},
        "runtime": {"type": "local"}, "verifier": {"type": "check_command"}, "dataset": {"path": str(data)},
        "farm": {"backend": "local"}, "run": {"samples": 1, "concurrency": 4, "max_attempts": 1},
    }
    (tmp_path / "reported.yaml").write_text(json.dumps(config))
    ran = rollout(tmp_path, "run", "--local", str(tmp_path / "reported.yaml"))
    assert ran.returncode == 3, ran.stderr  # the broken task failed on infrastructure for good
    return tmp_path / "reported"


def test_rollout_report_writes_a_self_contained_page_and_a_summary_image(finished_run, tmp_path):
    from PIL import Image

    out = rollout(tmp_path, "report", "reported")
    assert out.returncode == 0, out.stderr
    html, png = finished_run / "report.html", finished_run / "summary.png"
    assert out.stdout.splitlines() == [f"report: {html}", f"summary: {png}"]

    with Image.open(png) as image:
        image.load()  # decodes
        assert image.format == "PNG" and image.size == (1500, 900)
        panels = image.text["Description"]
        assert panels == "panels: " + "; ".join([*PANELS, "successes by task (reward >= 1)"])
        small = image.convert("L").resize((30, 18))
        for row in range(2):  # every panel has something drawn in it (bars, axes, or its "none")
            for col in range(3):
                cell = small.crop((col * 10, row * 9, col * 10 + 10, row * 9 + 9))
                assert cell.getextrema()[0] < 200, (row, col)

    text = html.read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", text)  # nothing fetched: a page that works offline
    assert "ModelError" in text and "uPlot" in text
    chromium()
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1600",
                          "--virtual-time-budget=3000", "--dump-dom", html.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert re.search(r'<body[^>]*data-charts="6"', page), page[-3000:]  # the failures chart too: one type
    for chart in ("rewards", "durations", "turns", "outcomes", "failures", "per-task"):
        assert f'<div id="chart-{chart}" class="chart" data-rendered="1"><div class="uplot' in page, chart
    assert page.count("<canvas") == 6
    assert "rollouts        7  (completed 6, infra_failed 1)" in page
    assert "ModelError" in page and "reward distribution" in page


def test_a_swe_run_shows_resolved_by_instance_and_matplotlib_missing_is_named(finished_run, tmp_path):
    from PIL import Image

    # What the SWE grader records (reward_details["resolved"]) makes the last panel resolved by instance.
    results = finished_run / "results.jsonl"
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    for line in lines:
        line["reward_details"] = {"resolved": line["reward"] == 1.0} if line["status"] == "completed" else {}
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert rollout(tmp_path, "report", str(finished_run)).returncode == 0  # by path, too
    with Image.open(finished_run / "summary.png") as image:
        assert image.text["Description"].endswith("; resolved by instance")
    assert '"swe": true' in (finished_run / "report.html").read_text()

    hidden = tmp_path / "no-matplotlib"  # an environment where matplotlib does not import
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    (finished_run / "summary.png").unlink()
    out = rollout(tmp_path, "report", "reported", path=(hidden,))
    assert out.returncode == 1
    assert out.stdout.strip() == f"report: {finished_run / 'report.html'}"
    assert "summary.png not written: summary.png needs matplotlib" in out.stderr
    assert "pip install 'rollout-farm[report]'" in out.stderr
    assert not (finished_run / "summary.png").exists() and (finished_run / "report.html").exists()

    missing = rollout(tmp_path, "report", "no-such-run")
    assert missing.returncode == 2 and "no-such-run" in missing.stderr


PROBE = """<script>
// The test's probe, run once report.js drew the charts: where each per-task label is and whether it shows whole.
setTimeout(function () {
  const box = document.getElementById("chart-per-task");
  const edge = box.parentElement.getBoundingClientRect();
  const spans = Array.from(box.querySelectorAll(".category-label"));
  document.body.dataset.probe = JSON.stringify(spans.map((span) => {
    const r = span.getBoundingClientRect();
    return { text: span.textContent, title: span.title, rect: [r.left, r.top, r.right, r.bottom],
             clipped: span.scrollWidth > span.clientWidth || span.scrollHeight > span.clientHeight,
             inside: r.left >= edge.left && r.right <= edge.right && r.top >= edge.top && r.bottom <= edge.bottom,
             on_top: document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2) === span };
  }));
}, 200);
</script>"""


@pytest.mark.parametrize("count", [3, 7])
def test_long_instance_labels_show_whole_under_their_bars(finished_run, tmp_path, count):
    """SWE-smith-style instance ids (60 characters) in the per-task panel: each label is under its bar in full, not
    clipped, inside its panel, not covered, and not on top of another (3 labels side by side, 7 upright)."""
    results = finished_run / "results.jsonl"
    lines = [json.loads(line) for line in results.read_text().splitlines()][:count]
    names = [f"pandas-dev__pandas.95b6b6c1.func_pm_remove_assign__{i:02d}kq3x7zz" for i in range(count)]
    for line, name in zip(lines, names):
        line["task_id"] = name
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (finished_run / "summary.json").unlink()
    assert rollout(tmp_path, "report", "reported").returncode == 0
    page = tmp_path / "probed.html"
    page.write_text((finished_run / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    chromium()
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,3000",
                          "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-probe="([^"]*)"', dom.stdout)
    assert found, dom.stdout[-3000:]
    labels = json.loads(html.unescape(found[1]))
    assert sorted(label["text"] for label in labels) == sorted(names)  # every label, whole
    for label in labels:
        assert label["title"] == label["text"] and not label["clipped"] and label["inside"] and label["on_top"], label
    boxes = sorted(label["rect"] for label in labels)
    assert all(a[2] <= b[0] for a, b in zip(boxes, boxes[1:])), boxes  # side by side, none over another


def test_a_distribution_of_one_value_is_one_bar_named_by_it():
    """Every reward 1.0 is one bar labelled 1, not a bin drawn over a range made up around it (0.925–1.075); a
    spread of values keeps its bins."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from cluster.web.report_data import histogram
    from cluster.web.report_png import _histogram

    one = Figure().add_subplot()
    _histogram(one, histogram([1.0] * 12), "reward", "#7c3aed")
    assert [t.get_text() for t in one.get_xticklabels()] == ["1"]
    assert [p.get_height() for p in one.patches] == [12]
    spread = Figure().add_subplot()
    _histogram(spread, histogram([0.0, 0.5, 1.0, 1.0]), "reward", "#7c3aed")
    assert len(spread.patches) == 12 and sum(p.get_height() for p in spread.patches) == 4
