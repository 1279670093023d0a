"""A run's report files: ``report.html`` (self-contained: the charting library and the data inlined) and
``summary.png`` (matplotlib, the ``report`` extra), written at the end of a run (``write_for_run``) and again by
``rollout report RUN`` (``write_report``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cluster.web import report_data, report_html, report_png
from cluster.web.report_png import MatplotlibMissing
from rollout.store.files import write_bytes

REPORT_HTML = "report.html"
SUMMARY_PNG = "summary.png"


def write_report(run_dir: str | Path, summary: dict[str, Any] | None = None) -> tuple[Path, Path | None]:
    """Write ``report.html`` and ``summary.png`` into ``run_dir`` from its results.jsonl and ``summary`` (default:
    its summary.json). Returns their paths; the PNG's is None when matplotlib is not installed (see
    ``missing_png_reason``)."""
    run_dir = Path(run_dir)
    data = report_data.collect(run_dir, summary)
    html_path = run_dir / REPORT_HTML
    write_bytes(html_path, report_html.render(data).encode("utf-8"))
    png_path = run_dir / SUMMARY_PNG
    tmp = png_path.with_name(f".{png_path.name}.tmp")
    try:
        report_png.write_png(data, tmp)
    except report_png.MatplotlibMissing:
        return html_path, None
    tmp.replace(png_path)
    return html_path, png_path


def missing_png_reason() -> str:
    """Why ``write_report`` wrote no summary.png, for the user."""
    return str(MatplotlibMissing())


def write_for_run(run_dir: str | Path, summary: dict[str, Any], say: Callable[[str], None]) -> None:
    """At the end of ``rollout run``: the report and the plot, named in ``summary["report"]``; never fails the run."""
    try:
        html, png = write_report(run_dir, summary)
        summary["report"] = {"html": str(html), "png": str(png) if png else None}
        if png is None:
            say(f"summary.png not written: {missing_png_reason()}")
    except Exception as exc:  # noqa: BLE001 - plots are a courtesy: the run's results stand
        say(f"report not written: {type(exc).__name__}: {exc}")
