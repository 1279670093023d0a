"""report.html: one self-contained file (the vendored uPlot, the page's style, the data and ``static/report.js``
inlined; nothing fetched) with the summary table, the infrastructure failures' first messages and six charts."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rollout.store.summary import format_table

STATIC = Path(__file__).resolve().parent / "static"
CHARTS = (("chart-rewards", "reward distribution"), ("chart-durations", "rollout duration distribution"),
          ("chart-turns", "turns per rollout"), ("chart-outcomes", "outcomes"),
          ("chart-failures", "infrastructure failures by type"), ("chart-per-task", None))


def render(data: dict[str, Any]) -> str:
    """The whole page for ``data`` (``report_data.collect``)."""
    esc = html.escape
    style = _static("uplot/uPlot.min.css") + "\n" + _static("page.css")
    script = _static("uplot/uPlot.iife.min.js") + "\n" + _static("report.js")
    payload = json.dumps(data, default=str).replace("<", "\\u003c")  # no "</script>" inside the data
    try:
        table = format_table(data["summary"])
    except (KeyError, TypeError, ValueError):  # a summary.json from another version: its numbers, as they are
        table = json.dumps(data["summary"], indent=1, default=str)
    boxes = "\n".join(
        f'<div class="chart-box"><h2>{esc(title or data["per_task"]["title"])}</h2>'
        f'<div id="{ident}" class="chart"></div></div>' for ident, title in CHARTS)
    failures = "".join(f"<tr><td>{esc(kind)}</td><td>{data['failures'].get(kind, 0)}</td>"
                       f'<td class="cmd">{esc(message)}</td></tr>' for kind, message in data["first_messages"].items())
    hidden = data["per_task"]["hidden"]
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rollout-farm report: {esc(data["run_id"])}</title>
<style>
{style}
</style>
</head>
<body>
<header><h1>run {esc(data["run_id"])} <span class="state finished">report</span></h1>
<div class="muted">run directory <code>{esc(data["run_dir"])}</code>; summary.png beside this file has the same
panels</div></header>
<h2>summary</h2>
<pre id="summary-table" class="card">{esc(table)}</pre>
<h2>infrastructure failures: first message of each type</h2>
<table id="failures"><thead><tr><th>type</th><th>count</th><th>first message</th></tr></thead>
<tbody>{failures or '<tr><td colspan="3">none</td></tr>'}</tbody></table>
<section class="charts">
{boxes}
</section>
<div class="muted">{f"per-task chart: the first {len(data['per_task']['tasks'])} tasks by id, {hidden} more not shown"
                     if hidden else ""}</div>
<script id="report-data" type="application/json">{payload}</script>
<script>
{script}
</script>
</body>
</html>
"""


def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")
