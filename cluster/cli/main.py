"""The ``rollout`` command: ``rollout run CONFIG... [key=value ...]``, ``rollout status RUN``,
``rollout repair RUN``, ``rollout images base|build``, ``rollout eval``, ``rollout report RUN``,
``rollout export RUN --format atif|sharegpt|hf``, ``rollout gc``,
``rollout fake-server``, ``rollout serve CONFIG`` and ``rollout models tiny DIR`` (``cluster.cli.serve``),
``rollout gym collect`` (``GYM``); ``rollout --version``.

Exit codes of ``rollout run``: 0 every rollout has a task outcome; 2 bad config, dataset, a changed run (config
or dataset rows), a run directory another run is writing, or a check that fails before any work (one line per problem,
naming its field; nothing written); 3 some rollouts ended ``infra_failed`` for good (the summary gives the first message
of each error type); 130 interrupted (re-run the same command to resume). ``rollout status`` exits 0 whatever
the run's state, 2 when no such run exists. ``rollout repair`` exits 0 (also when nothing needed repair), 2 when
no such run exists or a run is writing it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from cluster.cli.parser import HelpParser, config_failure
from rollout.errors import ConfigError

EXIT_INFRA_FAILED = 3
"""``rollout run``'s exit code when some rollouts ended ``infra_failed`` after all their attempts."""
def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    paths = [i for i in items if "=" not in i]
    overrides = [i for i in items if "=" in i]
    if not paths:
        raise ConfigError("give at least one config file", "CONFIG")
    return paths, overrides


def cmd_run(args: argparse.Namespace) -> int:
    from cluster.run import job as jobs
    from cluster.web.live_page import LivePageSettings
    from rollout.gc_tuning import tune_gc

    paths, overrides = split_items(args.items)
    if args.address:
        overrides.append(f"farm.address={args.address}")
    if args.local:
        overrides.append("farm.backend=local")
    job = jobs.prepare(paths, overrides, new_run=args.new_run, retry_infra=args.retry_infra)
    if args.web:
        job.web = LivePageSettings(args.web_host, args.web_port, args.web_token)
    tune_gc()
    try:
        summary = asyncio.run(jobs.execute(job))
    except KeyboardInterrupt:
        print(f"interrupted; finished rollouts are in {job.run_dir}; run the same command to resume",
              file=sys.stderr)
        return 130
    finally:
        job.store.close()
    failed = summary["rollouts"]["infra_failed"]
    if failed:
        # `ray job submit` and CI see a run that did not do its work as failed, not as success
        print(f"{failed} rollout(s) failed on infrastructure for good (see the summary; --retry-infra runs them "
              "again)", file=sys.stderr)
        return EXIT_INFRA_FAILED
    return 0


def _existing_run_dir(run: str):
    """The run directory ``run`` names, or None after saying why there is none."""
    from cluster.cli import status

    try:
        return status.find_run_dir(run)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return None


def cmd_repair(args: argparse.Namespace) -> int:
    from rollout.store.run_dir import RunStore

    run_dir = _existing_run_dir(args.run)
    if run_dir is None:
        return 2
    with RunStore(run_dir) as store:
        done = store.repair()
    if not done["moved"]:
        print(f"{store.results_path}: all {done['kept']} line(s) are results; nothing to repair")
        return 0
    for line, why in done["moved"]:
        print(f"line {line}: {why}")
    print(f"moved {len(done['moved'])} line(s) to {store.bad_path}; kept {done['kept']}; "
          "re-run the run's command to run their rollouts again")
    return 0


def cmd_fake_server(args: argparse.Namespace) -> int:
    from cluster.names import POLICIES
    from cluster.serving.scripted_server.server import ScriptedServerConfig, serve

    serve(ScriptedServerConfig(host=args.host, port=args.port, policy=POLICIES.resolve(args.policy),
                           latency=args.latency, dataset=args.dataset, model=args.model))
    return 0


def gym_main(argv: list[str]) -> int:
    """``rollout gym NAME ...``: NAME's function parses the rest (``GYM``)."""
    import importlib

    from cluster.cli.parser import GYM

    parser = HelpParser(prog="rollout gym", description="NeMo Gym's contract on the farm.")
    sub = parser.add_subparsers(dest="name", required=True)
    for name, (_, text) in GYM.items():
        sub.add_parser(name, help=text, add_help=False)
    module, function = GYM[parser.parse_args(argv[:1]).name][0].split(":")
    try:
        return getattr(importlib.import_module(module), function)(argv[1:])
    except ConfigError as exc:
        return config_failure(exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["images"]:  # its own argument parser, options included
        from cluster.cli import images as images_cli

        return images_cli.main(argv[1:])
    if argv[:1] == ["gym"]:
        return gym_main(argv[1:])
    if argv[:1] == ["dev-cluster"]:
        from cluster.cli import dev_cluster

        return dev_cluster.main(argv[1:])
    if argv[:1] in (["serve"], ["models"]):
        from cluster.cli import serve as serve_cli

        try:
            return (serve_cli.serve_main if argv[0] == "serve" else serve_cli.models_main)(argv[1:])
        except ConfigError as exc:
            return config_failure(exc)
    if argv[:1] == ["eval"]:
        from cluster.cli import eval as eval_cli

        return eval_cli.main(argv[1:])
    if argv[:1] == ["check-tasks"]:
        from cluster.cli import check_tasks

        return check_tasks.main(argv[1:])
    if argv[:1] == ["export"]:
        from cluster.cli import export

        return export.main(argv[1:])
    if argv[:1] in (["report"], ["metrics"]):
        from cluster.cli import metrics as metrics_cli, report

        return (report.main if argv[0] == "report" else metrics_cli.main)(argv[1:])
    from cluster.cli.parser import build_parser

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "run" and not any(e.startswith("-") for e in extra):
        args.items += extra  # CONFIG and key=value items may also follow an option (--address X a=b)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "status":
            from cluster.cli import status

            return status.command(args)
        if args.command == "repair":
            return cmd_repair(args)
        if args.command == "gc":
            from envs.runtimes.docker.containers import run_gc

            return run_gc(args.run_id, args.older_than, args.engine, args.force)
        return cmd_fake_server(args)
    except ConfigError as exc:
        return config_failure(exc)


if __name__ == "__main__":
    sys.exit(main())
