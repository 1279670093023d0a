"""The live page, as a person sees it: a real run (``rollout run --local``, a scripted model whose commands take a
while), ``rollout status RUN --web`` serving its page, loaded twice in headless Chromium (Debian's ``chromium``):
progress, in-flight rows (a hanging one flagged) and the charts are in the rendered DOM and change between loads.
Bound wider than 127.0.0.1, the page wants its token. The browser tests skip without chromium unless
``ROLLOUT_REQUIRE_CHROMIUM=1`` (as in CI)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cluster.web.live_page import start_for_run
from rollout.store import live

REPO = Path(__file__).resolve().parents[3]
POLICY = textwrap.dedent('''
    """Scripted policy for the live page's tests: ``turns`` commands of ``sleep <pause>``, then submit."""
    from rollout.models.policies import SUBMIT_SENTINEL


    def steady(messages, ctx):
        data = ctx.task.data if ctx.task is not None else {}
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        if turn <= int(data.get("turns", 1)):
            return f"Turn {turn}.\\n```bash\\nsleep {data.get('pause', 0)} && echo turn {turn}\\n```"
        return f"Done.\\n```bash\\necho {SUBMIT_SENTINEL}\\n```"
''')
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("ROLLOUT_REQUIRE_CHROMIUM", "") not in ("", "0", "false", "no"):
        pytest.fail("ROLLOUT_REQUIRE_CHROMIUM is set but chromium is not installed")
    pytest.skip("chromium is not installed (apt-get install chromium; ROLLOUT_REQUIRE_CHROMIUM=1 makes this an error)")


def browse(url: str, profile: Path, screenshot: Path | None = None, budget_ms: int = 3000) -> str:
    """The DOM after the page's scripts ran for ``budget_ms`` of virtual time (or a screenshot of it)."""
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            f"--user-data-dir={profile}", "--window-size=1400,1700", f"--virtual-time-budget={budget_ms}"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


class Dom(HTMLParser):
    """A rendered page: every element with its attributes, text content and the tags inside it."""

    def __init__(self, html: str):
        super().__init__()
        self.elements: list[dict] = []
        self.open: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "inside": []}
        for parent in self.open:
            parent["inside"].append(element)
            parent["text"] += " "  # cells and lines apart, as on the screen
        self.elements.append(element)
        if tag not in VOID:
            self.open.append(element)

    def handle_endtag(self, tag):
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i]["tag"] == tag:
                del self.open[i:]
                break

    def handle_data(self, data):
        for element in self.open:
            element["text"] += data

    def by_id(self, ident: str) -> dict:
        (element,) = [e for e in self.elements if e["attrs"].get("id") == ident]
        return element

    def text(self, ident: str) -> str:
        return " ".join(self.by_id(ident)["text"].split())

    def rows(self, ident: str) -> dict[str, dict]:
        """The rows of a table's body that name a task, by task."""
        return {e["attrs"]["data-task"]: e for e in self.by_id(ident)["inside"]
                if e["tag"] == "tr" and "data-task" in e["attrs"]}

    def cells(self, ident: str) -> list[list[str]]:
        """A table's body, row by row."""
        (body,) = [e for e in self.by_id(ident)["inside"] if e["tag"] == "tbody"]
        return [[" ".join(td["text"].split()) for td in tr["inside"] if td["tag"] == "td"]
                for tr in body["inside"] if tr["tag"] == "tr"]


def write_run(tmp_path: Path, tasks: list[dict], run_id: str, concurrency: int = 3) -> Path:
    (tmp_path / "live_page_policies.py").write_text(POLICY)
    data = tmp_path / f"{run_id}.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = {
        "run_id": run_id, "model": {"type": "scripted", "policy": "live_page_policies:steady"},
        "agent": {"type": "mini_swe", "max_steps": 50}, "environment": {"type": "shell", "command_timeout": 120},
        "runtime": {"type": "local"}, "verifier": {"type": "check_command"}, "dataset": {"path": str(data)},
        "farm": {"backend": "local"},
        "run": {"samples": 1, "concurrency": concurrency, "max_attempts": 1, "progress_interval": 0.5},
        "output": {"dir": f"{run_id}-dir"},
    }
    path = tmp_path / f"{run_id}.yaml"
    path.write_text(json.dumps(config))
    return path


def task(task_id: str, pause: float, turns: int, passes: bool = True) -> dict:
    return {"task_id": task_id, "prompt": "Sleep as told, then submit.",
            "data": {"pause": pause, "turns": turns, "check": "true" if passes else "false"}}


def cli_env(home: Path) -> dict:
    return {**os.environ, "ROLLOUT_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(home), str(REPO)])}


def wait_for(what: str, condition, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def live_doc(run_dir: Path) -> dict | None:
    try:
        return live.read_live(run_dir)
    except (FileNotFoundError, ValueError):
        return None


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=30)


def test_the_live_page_of_a_running_run_shows_progress_rollouts_and_charts_that_move(tmp_path):
    chromium()
    # "hang" sleeps 16 s in one command (STALLED after 3 s); the others take three 0.8 s turns, 3 at a time
    tasks = [task("hang", 16, 1)] + [task(f"t{i:02d}", 0.8, 3, passes=i % 3 != 0) for i in range(1, 12)]
    config = write_run(tmp_path, tasks, "watched")
    run_dir = tmp_path / "watched-dir"
    run = subprocess.Popen([sys.executable, "-m", "cluster", "run", "--local", str(config)], env=cli_env(tmp_path),
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "run.stderr").open("w"),
                           start_new_session=True)
    web = None
    try:
        wait_for("the run to start", lambda: (live_doc(run_dir) or {}).get("in_flight"))
        web = subprocess.Popen([sys.executable, "-m", "cluster", "status", "watched", "--web", "--stall", "3"],
                               env=cli_env(tmp_path), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
        first_line = web.stdout.readline()
        assert first_line.startswith("live page of watched-dir: http://127.0.0.1:"), first_line + web.stderr.read()
        url = first_line.split(": ", 1)[1].strip()
        assert "token" not in url  # bound to 127.0.0.1: no token needed

        wait_for("a finished rollout", lambda: (live_doc(run_dir) or {}).get("done", 0) >= 1)
        first = Dom(browse(url, tmp_path / "profile"))
        done_first = int(first.text("done"))
        assert first.text("run-id") == "watched" and first.text("state") == "RUNNING"
        assert first.text("total") == "12" and 1 <= done_first < 12
        assert f"{done_first}/12 done" in first.text("progress-line")
        rows_first = first.rows("in-flight")
        assert rows_first and set(rows_first) <= {t["task_id"] for t in tasks}
        row = next(iter(rows_first.values()))
        assert "sleep" in row["text"] and "local" in row["text"]  # the last command and the node
        # slots in use, one process, no adaptive limit (farm.adaptive is off)
        assert first.cells("nodes") == [["local", str(len(rows_first)), "1", "-"]]
        throughput = first.by_id("chart-throughput")
        assert any(e["tag"] == "canvas" for e in throughput["inside"])  # uPlot drew it
        points_first = int(throughput["attrs"]["data-points"])
        assert points_first >= 2

        wait_for("more progress", lambda: (live_doc(run_dir) or {}).get("done", 0) >= done_first + 3)
        second = Dom(browse(url, tmp_path / "profile", budget_ms=2000))
        assert int(second.text("done")) >= done_first + 3
        assert second.text("progress-line") != first.text("progress-line")
        rows_second = second.rows("in-flight")
        assert rows_second and set(rows_second) != set(rows_first)
        assert int(second.by_id("chart-throughput")["attrs"]["data-points"]) > points_first
        assert any(e["tag"] == "canvas" for e in second.by_id("chart-reward")["inside"])
        assert ["submitted", str(int(second.text("done")))] in second.cells("outcomes")
        hang = (rows_second.get("hang") or rows_first.get("hang"))
        assert hang is not None and hang["attrs"].get("class") == "stalled" and "STALLED" in hang["text"]

        shot = tmp_path / "live.png"
        browse(url, tmp_path / "profile", screenshot=shot, budget_ms=1500)
        from PIL import Image

        with Image.open(shot) as image:
            image.load()
            assert image.size == (1400, 1700)
            assert len(image.resize((70, 85)).getcolors(maxcolors=6000) or []) > 20  # a page drawn, not blank
    finally:
        stopped = stop(web) if web is not None else 0
        try:
            ended = run.wait(timeout=90)
        except subprocess.TimeoutExpired:
            ended = stop(run)
    assert stopped == 0 and ended == 0, (tmp_path / "run.stderr").read_text()[-3000:]


REWARD_LINE = (0x93, 0x33, 0xEA)
"""The reward chart's stroke (live.js: #9333ea)."""


def test_the_live_page_of_a_finished_run_charts_its_rewards(tmp_path):
    """Opened after the run ended, the page draws the reward mean as the rollouts finished, not an empty chart."""
    chromium()
    tasks = [task(f"t{i}", 0.2, 2, passes=i % 2 == 0) for i in range(6)]
    config = write_run(tmp_path, tasks, "finished", concurrency=2)
    ran = subprocess.run([sys.executable, "-m", "cluster", "run", "--local", str(config)], env=cli_env(tmp_path),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    page = start_for_run(tmp_path / "finished-dir")
    try:
        state = json.loads(get(page.url + "api/state")[1])
        assert state["state"] == "finished" and state["reward_mean"] == 0.5
        rewards = [r for r in state["history"]["reward_mean"] if r is not None]
        # one point per result, as they came: the first is one result's reward (t0 and t1 run at once, either may
        # end first), the last the mean of all six
        assert len(rewards) >= 6 and rewards[0] in (0.0, 1.0) and rewards[-1] == 0.5
        assert state["history"]["t"] == sorted(state["history"]["t"])
        dom = Dom(browse(page.url, tmp_path / "profile", budget_ms=1500))
        chart = dom.by_id("chart-reward")
        assert any(e["tag"] == "canvas" for e in chart["inside"]) and int(chart["attrs"]["data-points"]) >= 6
        shot = tmp_path / "finished.png"
        browse(page.url, tmp_path / "profile", screenshot=shot, budget_ms=1500)
    finally:
        page.stop()
    from PIL import Image

    with Image.open(shot) as image:
        pixels = image.convert("RGB").load()
        width, height = image.size
        drawn = [x for x in range(width) for y in range(height)
                 if all(abs(c - want) < 30 for c, want in zip(pixels[x, y], REWARD_LINE))]
    # the line runs across the chart (the legend's marker alone is about 14 pixels wide)
    assert drawn and max(drawn) - min(drawn) > 200, (len(drawn), min(drawn, default=None), max(drawn, default=None))


def get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_bound_wider_the_page_needs_its_token(tmp_path):
    config = write_run(tmp_path, [task("a", 0, 1), task("b", 0, 2, passes=False)], "quick")
    ran = subprocess.run([sys.executable, "-m", "cluster", "run", "--local", str(config)], env=cli_env(tmp_path),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    run_dir = tmp_path / "quick-dir"

    page = start_for_run(run_dir, "0.0.0.0")
    try:
        assert page.token and f"?token={page.token}" in page.url
        local = f"http://127.0.0.1:{page.port}"
        assert get(f"{local}/api/state")[0] == 401
        assert get(f"{local}/")[0] == 401
        assert get(f"{local}/api/state?token=wrong")[0] == 401
        code, body = get(f"{local}/api/state?token={page.token}")
        assert code == 200
        state = json.loads(body)
        assert state["state"] == "finished" and state["done"] == state["total"] == 2 and state["in_flight"] == []
        assert state["outcomes"] == {"submitted": 2} and state["reward_mean"] == 0.5
        assert get(f"{local}/api/state", {"Authorization": f"Bearer {page.token}"})[0] == 200
        assert get(f"{local}/api/state", {"X-Rollout-Token": page.token})[0] == 200
        assert get(f"{local}/?token={page.token}")[1].startswith(b"<!doctype html>")
        code, library = get(f"{local}/static/uplot/uPlot.iife.min.js")  # code, no run data: served to anyone
        assert code == 200 and b"uPlot" in library
        assert get(f"{local}/static/../live_page.py")[0] == 404
    finally:
        page.stop()

    mine = start_for_run(run_dir, "127.0.0.1", token="s3cret")  # a token given is asked for on 127.0.0.1 too
    try:
        assert get(f"http://127.0.0.1:{mine.port}/api/state")[0] == 401
        assert get(f"http://127.0.0.1:{mine.port}/api/state?token=s3cret")[0] == 200
    finally:
        mine.stop()
    plain = start_for_run(run_dir)
    try:
        assert plain.url == f"http://127.0.0.1:{plain.port}/" and get(plain.url + "api/state")[0] == 200
    finally:
        plain.stop()


def test_the_live_page_draws_each_nodes_adaptive_limit_over_time(tmp_path):
    """``farm.adaptive``: the page charts each node's limit as it moved and says where it is in the nodes' table."""
    chromium()
    run_dir = tmp_path / "adaptive-dir"
    run_dir.mkdir()
    t0 = time.time() - 60
    limits = {"a9237dbf0e11aa": {"capacity": 64, "start": 4, "started_at": t0, "limit": 6, "changed": 3, "changes": [
        {"at": t0 + 10, "old": 4, "new": 6, "why": "completions/s 1.1: +2"},
        {"at": t0 + 20, "old": 6, "new": 8, "why": "completions/s 1.1 → 1.3: +2"},
        {"at": t0 + 30, "old": 8, "new": 6, "why": "start p90 6.2 s > 2× 2.1 s: ×0.7"}]},
        "5e6f7a8b9c0d11": {"capacity": 64, "start": 4, "started_at": t0 + 5, "limit": 4, "changed": 0, "changes": []}}
    live.write_live(run_dir, live.live_document("adaptive", {"done": 9, "total": 9}, [], in_flight=0,
                                                state=live.FINISHED, started_at=t0, limits=limits))
    page = start_for_run(run_dir)
    try:
        state = json.loads(get(page.url + "api/state")[1])
        series = {n["node"]: n["limit"] for n in state["limits"]["nodes"]}
        assert series == {"5e6f7a8b9c0d": [None, 4, 4, 4, 4, 4], "a9237dbf0e11": [4, 4, 6, 8, 6, 6]}
        dom = Dom(browse(page.url, tmp_path / "profile", budget_ms=1500))
    finally:
        page.stop()
    box = dom.by_id("limits-box")
    assert "hidden" not in box["attrs"] and "adaptive limit per node" in box["text"]
    chart = dom.by_id("chart-limits")
    assert any(e["tag"] == "canvas" for e in chart["inside"]) and chart["attrs"]["data-points"] == "6"
    assert "node a9237dbf" in box["text"] and "node 5e6f7a8b" in box["text"]  # the legend names both nodes
    assert dom.cells("nodes") == [["5e6f7a8b9c0d", "0", "0", "4 of 64"], ["a9237dbf0e11", "0", "0", "6 of 64"]]
