"""``rollout eval --dataset D --predictions P``: grade a predictions file, writing the reports a run writes.

Exit codes: 0 graded (failed instances are errors in the report); 1 an image cannot be had; 2 bad
arguments, dataset or predictions (one line naming the problem); 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from cluster.cli.parser import HelpParser, config_failure
from rollout.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="rollout eval", description="Grade SWE-bench predictions against a dataset, "
                        "each instance in a fresh runtime, and write the harness's reports.")
    parser.add_argument("--dataset", required=True, help="SWE-bench-style JSONL or JSON; repo_path is relative to it")
    parser.add_argument("--predictions", required=True, help="predictions: a JSON object by instance id, a JSON "
                        "list, or JSONL (instance_id, model_name_or_path, model_patch)")
    parser.add_argument("--run-id", default=None, help="run id (default: the predictions file's stem)")
    parser.add_argument("--out", default=None, help="where the reports go (default: $ROLLOUT_HOME/<run id>, "
                        "ROLLOUT_HOME defaulting to ./runs)")
    parser.add_argument("--runtime", choices=["docker", "apptainer", "local"], default="docker",
                        help="docker: a container of each instance's image (missing images are built from "
                        "repo_path); apptainer: an instance of that image, converted once per node, run "
                        "unprivileged; local: a host workspace with repo_path cloned (runs the tests unisolated)")
    parser.add_argument("--workers", type=int, default=2, help="instances graded at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the tests of one instance may run")
    parser.add_argument("--allow-outside-paths", action="store_true", help="let repo_path be absolute or lead out "
                        "of the dataset's directory (refused by default: a dataset must not reach any host path)")
    parser.add_argument("--model", default=None, help="model name in the report paths (default: the predictions' "
                        "model_name_or_path)")
    return parser


def out_dir(run_id: str, out: str | None) -> Path:
    if out:
        return Path(out).resolve()
    return Path(os.environ.get("ROLLOUT_HOME", "runs")).resolve() / run_id


def print_summary(summary: dict[str, Any], where: Path) -> None:
    total = summary["total_instances"]
    print(f"resolved {summary['resolved_instances']}/{total} "
          f"(submitted {summary['submitted_instances']}, completed {summary['completed_instances']}, "
          f"unresolved {summary['unresolved_instances']}, empty patch {summary['empty_patch_instances']}, "
          f"error {summary['error_instances']}, incomplete {len(summary['incomplete_ids'])})")
    for key in ("unresolved_ids", "error_ids"):
        if summary[key]:
            print(f"{key.removesuffix('_ids')}: {', '.join(summary[key])}")
    print(f"reports in {where}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on bad arguments (2); return the code instead
        return int(exc.code or 0)
    from envs.images.daemon import ImageError
    from envs.swe.evaluate import evaluate

    try:
        if args.workers < 1:
            raise ConfigError(f"must be at least 1, got {args.workers}", "--workers")
        if args.timeout <= 0:
            raise ConfigError(f"must be positive, got {args.timeout:g}", "--timeout")
        run_id = args.run_id or Path(args.predictions).stem
        where = out_dir(run_id, args.out)
        print(f"evaluating {args.predictions} against {args.dataset} ({args.runtime}, {args.workers} at a time) "
              f"into {where}", flush=True)
        summary = asyncio.run(evaluate(args.dataset, args.predictions, run_id=run_id, out_root=where,
                                       runtime=args.runtime, workers=args.workers, eval_timeout=args.timeout,
                                       model_name=args.model, progress=lambda line: print(line, flush=True),
                                       allow_outside_paths=args.allow_outside_paths))
    except ConfigError as exc:
        return config_failure(exc)
    except ImageError as exc:
        print(f"image error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; run the same command again to grade from the start", file=sys.stderr)
        return 130
    print_summary(summary, where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
