"""``rollout export RUN --format atif|sharegpt|hf [--out DIR]``: a run's rollouts as ATIF-v1.8 trajectory files (one
per rollout, named by rollout id) or as SFT rows in Harbor's ``traces export`` shape (``<format>.jsonl``), made by
``rollout.formats``. Who ran each rollout comes from the run's config.json and manifest.json
(``rollout.formats.export.AgentNames``).

Exit codes: 0 written (rollouts without a trajectory are named on stderr); 2 no such run, or nothing to export.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.cli.parser import HelpParser


def main(argv: list[str]) -> int:
    from cluster.cli.status import find_run_dir
    from rollout.formats.export import FORMATS, AgentNames, export_run

    parser = HelpParser(prog="rollout export", description="Write a run's rollouts in another format: "
                        "ATIF trajectory files (Harbor and other agent projects read them) or SFT rows.")
    parser.add_argument("run", metavar="RUN_DIR_OR_RUN_ID", help="a run directory, or a run id under $ROLLOUT_HOME")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, required=True,
                        help="atif: one ATIF-v1.8 JSON file per rollout; sharegpt: one JSONL row per rollout in "
                        "Harbor's traces shape with a conversations_sharegpt column; hf: the same rows without it")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="directory to write into (default: RUN_DIR/export/FORMAT)")
    args = parser.parse_args(argv)
    try:
        run_dir = find_run_dir(args.run)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not (run_dir / "results.jsonl").exists():
        print(f"{run_dir} has no results.jsonl: nothing to export yet", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else run_dir / "export" / args.fmt
    warn = lambda text: print(text, file=sys.stderr)  # noqa: E731
    done = export_run(run_dir, args.fmt, out, AgentNames.of_run(run_dir, warn=warn))
    for rollout_id, why in done.skipped:
        print(f"skipped {rollout_id}: {why}", file=sys.stderr)
    if args.fmt == "atif":
        print(f"{len(done.paths)} ATIF file(s) in {out}")
        return 0 if done.paths else 2
    print(f"{done.rows} row(s) in {done.paths[0]}")
    return 0 if done.rows else 2

