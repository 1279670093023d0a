"""``rollout report RUN``: a run's ``report.html`` and ``summary.png`` written again from its run directory
(``cluster.web.report_files``).

``rollout report`` exits 0 when both files were written, 1 when summary.png could not be (matplotlib missing:
report.html is still written), 2 when there is no such run.
"""

from __future__ import annotations

import sys

from cluster.cli.parser import HelpParser
from cluster.web.report_files import missing_png_reason, write_report


def main(argv: list[str]) -> int:
    from cluster.cli.status import find_run_dir

    parser = HelpParser(prog="rollout report", description="Write a run's report.html (charts, "
                        "self-contained) and summary.png again from its run directory.")
    parser.add_argument("run", metavar="RUN_DIR_OR_RUN_ID", help="a run directory, or a run id under $ROLLOUT_HOME")
    args = parser.parse_args(argv)
    try:
        run_dir = find_run_dir(args.run)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not (run_dir / "results.jsonl").exists():
        print(f"{run_dir} has no results.jsonl: nothing to report yet", file=sys.stderr)
        return 2
    html_path, png_path = write_report(run_dir)
    print(f"report: {html_path}")
    if png_path is None:
        print(f"summary.png not written: {missing_png_reason()}", file=sys.stderr)
        return 1
    print(f"summary: {png_path}")
    return 0
