"""``rollout status``: find a run's directory, and report its progress, its in-flight rollouts (stalled ones
flagged) from the live view, or once it is over the counts in results.jsonl; ``--watch`` redraws it, ``--web``
serves the live page (``cluster.web.live_page``) until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rollout.store.live import RUNNING, STALE, format_age, live_condition, read_live

STALL_SECONDS = 60.0
"""``rollout status`` flags an in-flight rollout as stalled after this long without progress."""


def find_run_dir(run: str | Path) -> Path:
    """A run directory, given as a path, or as a run id / output dir under ``$ROLLOUT_HOME``."""
    path = Path(run).expanduser()
    if path.is_dir():
        return path.resolve()
    from cluster.session.home import rollout_home

    home = rollout_home()
    if (home / str(run)).is_dir():
        return home / str(run)
    if home.is_dir():  # output.dir may differ from the run id: the live view names its run
        for candidate in sorted(home.iterdir()):
            try:
                if candidate.is_dir() and read_live(candidate).get("run_id") == str(run):
                    return candidate
            except (OSError, ValueError):
                continue
    raise FileNotFoundError(f"no run directory {str(run)!r}, nor a run with that id under {home}")


def status_report(run_dir: str | Path, stall: float = STALL_SECONDS, now: float | None = None) -> tuple[str, str]:
    """The run's state (``live_condition``; ``unknown`` without a live view) and what ``rollout status`` prints:
    its progress, and either its in-flight rollouts (those without progress for ``stall`` seconds flagged
    STALLED) or, once it is over, the counts in results.jsonl."""
    from rollout.store.summary import format_progress

    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    try:
        doc = read_live(run_dir)
    except (FileNotFoundError, ValueError) as exc:  # ValueError: a damaged live.json (not JSON, not UTF-8)
        why = "not started yet, or run by an older version" if isinstance(exc, FileNotFoundError) else "unreadable"
        return "unknown", "\n".join([f"run {run_dir.name}: no live view ({why})", f"run directory: {run_dir}",
                                      results_report(run_dir)])
    state, why = live_condition(doc, now)
    lines = [f"run {doc.get('run_id', run_dir.name)}: {state.upper()} ({why})", f"run directory: {run_dir}"]
    if state == STALE:
        lines.append("it is not running any more: re-run the same command to resume it")
    rows = doc.get("in_flight") or []
    in_flight = len(rows) + int(doc.get("queued") or 0) if state == RUNNING else None
    lines.append("progress: " + format_progress(doc, in_flight))
    if state != RUNNING:
        if state == STALE and rows:
            lines.append(f"{len(rows)} rollout(s) were in flight at the last update")
        lines.append(results_report(run_dir))
        return state, "\n".join(lines)
    stalled = [r for r in rows if r.get("last_progress") and now - r["last_progress"] >= stall]
    head = f"in flight: {len(rows)}"
    if doc.get("queued"):
        head += f" (+{doc['queued']} waiting for a worker slot)"
    if stalled:
        head += f"; {len(stalled)} STALLED (no progress for {stall:g}s or more)"
    lines.append(head)
    if rows:
        lines.append(in_flight_table(rows, stall, now))
    return state, "\n".join(lines)


def in_flight_table(rows: list[dict[str, Any]], stall: float, now: float) -> str:
    header = ("TASK", "SAMPLE", "TRY", "STEP", "ELAPSED", "IDLE", "NODE", "LAST COMMAND", "")
    table = [header]
    for r in rows:
        idle = now - r["last_progress"] if r.get("last_progress") else None
        table.append((
            str(r.get("task_id", ""))[:40], str(r.get("sample_index", "")), str(r.get("attempt", "")),
            str(r.get("step", "")),
            format_age(now - r["started"]) if r.get("started") else "-",
            format_age(idle) if idle is not None else "-",
            (r.get("node_id") or "")[:8] or "local",
            shorten(r.get("last_command")),
            "STALLED" if idle is not None and idle >= stall else "",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table)


def shorten(command: str | None, limit: int = 48) -> str:
    if not command:
        return "-"
    flat = " ".join(str(command).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def results_report(run_dir: str | Path) -> str:
    """The summary counts of the run's results.jsonl so far, read as resume and repair read it: a torn last line
    (mid-append) is left out, a damaged line (not JSON, not UTF-8, not a result) is skipped and named."""
    from rollout.store.files import parse_results
    from rollout.store.summary import format_table, summarize

    path = Path(run_dir) / "results.jsonl"
    if not path.exists():
        return "results: none yet"
    parsed = parse_results(path)
    results = parsed.results
    samples = 1
    try:
        samples = int(json.loads((Path(run_dir) / "config.json").read_text())["run"]["samples"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    summary = summarize(results, k_values=(1, samples) if samples > 1 else (1,))
    report = "results (results.jsonl):\n" + "\n".join("  " + line for line in format_table(summary).splitlines())
    if parsed.bad:
        numbers = [number for number, _raw, _why in parsed.bad]
        shown = ", ".join(map(str, numbers[:10])) + (" ..." if len(numbers) > 10 else "")
        report += (f"\n{len(numbers)} damaged line(s) skipped ({shown}): their rollouts run again on resume; "
                   f"`rollout repair {run_dir}` moves them aside")
    return report


def command(args: argparse.Namespace) -> int:
    """``rollout status RUN [--watch | --web [--host H] [--port P] [--token T]]``: 0, or 2 when there is no
    such run (or the page's address cannot be bound)."""
    try:
        run_dir = find_run_dir(args.run)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.web:
        return serve_web(run_dir, args.host, args.port, args.token, args.stall)
    clear = args.watch and sys.stdout.isatty()
    try:
        while True:
            state, report = status_report(run_dir, stall=args.stall)
            print(("\x1b[H\x1b[2J" if clear else "") + report, flush=True)
            if not args.watch or state != RUNNING:
                return 0
            time.sleep(2.0)
            if not clear:
                print(flush=True)
    except KeyboardInterrupt:
        return 0


def serve_web(run_dir: Path, host: str, port: int, token: str | None, stall: float) -> int:
    """Serve the run's live page until Ctrl-C (or SIGTERM); its URL is the first line printed."""
    import signal

    from cluster.web.live_page import start_for_run

    try:
        page = start_for_run(run_dir, host, port, token, stall=stall)
    except OSError as exc:
        print(f"cannot serve the live page on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"live page of {run_dir.name}: {page.url}", flush=True)
    print("Ctrl-C stops it" + ("" if page.token is None else "; the page needs the token in its URL"), flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        page.stop()
