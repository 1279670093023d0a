"""The ``rollout`` command's arguments: one subparser per subcommand (those that parse their own arguments,
``images``, ``eval``, ``serve``, ``models``, ``gym``, ``dev-cluster``, ``report``, ``export``, ``metrics``, are
listed for ``--help`` only), and
``GYM``, the ``rollout gym`` subcommands. ``main`` (``cluster.cli.main``) dispatches."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rollout.errors import ConfigError


class PlainHelpFormatter(argparse.HelpFormatter):
    """Help whose text came from docstrings, shown as plain text: reStructuredText's inline literals (two backticks
    each side) lose their markup, in descriptions, epilogs and every argument's help."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain(super()._expand_help(action))


class HelpParser(argparse.ArgumentParser):
    """The CLI's argument parser: its help and its subcommands' (which are HelpParsers too) in plain text."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)


def plain(text: str) -> str:
    """``text`` without reStructuredText inline-literal markup."""
    return re.sub(r"``(.+?)``", r"\1", text, flags=re.S)


GYM = {"serve": ("cluster.cli.gym_serve:serve_main", "the NeMo-Gym-compatible agent server (/run, /v1/responses)"),
       "collect": ("cluster.cli.gym_collect:main", "run NeMo Gym rows through the farm into rollouts JSONL; resumable")}
"""``rollout gym NAME ...``: ``module:function`` that parses and runs NAME's arguments (``function(argv)``), help."""


def build_parser() -> argparse.ArgumentParser:
    from cluster.cli.version import DIST, package_version
    from cluster.names import POLICIES

    parser = HelpParser(prog="rollout",
                        description="Run LLM-agent rollouts and write resumable run directories.")
    parser.add_argument("--version", action="version", version=f"{DIST} {package_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a dataset through an agent; re-running resumes")
    run.add_argument("items", nargs="+", metavar="CONFIG|key=value",
                     help="config files (merged in order), then key.path=value overrides")
    run.add_argument("--new-run", action="store_true",
                     help="start over even if the stored run's config differs (old files are kept aside)")
    run.add_argument("--retry-infra", action="store_true",
                     help="run again the rollouts whose infrastructure failures used up their attempts")
    run.add_argument("--address", default=None,
                     help="Ray cluster to run on (same as farm.address; default $RAY_ADDRESS, else an embedded one)")
    run.add_argument("--local", action="store_true",
                     help="run the rollouts in this process instead of on Ray (same as farm.backend=local)")
    run.add_argument("--web", action="store_true", help="serve the run's live page while it runs (prints its URL)")
    run.add_argument("--web-host", default="127.0.0.1", help="the live page's interface (default 127.0.0.1; "
                     "any other needs a token)")
    run.add_argument("--web-port", type=int, default=0, help="the live page's port (default: a free one)")
    run.add_argument("--web-token", default=None, help="the live page's token (default: made when bound wider)")

    status = sub.add_parser("status", help="what a run is doing: progress, in-flight rollouts, stalled ones")
    status.add_argument("run", metavar="RUN_DIR_OR_RUN_ID", help="a run directory, or a run id under $ROLLOUT_HOME")
    status.add_argument("--stall", type=float, default=60.0, metavar="SECONDS",
                        help="flag in-flight rollouts without progress for this long as STALLED (default 60)")
    status.add_argument("--watch", action="store_true", help="redraw every 2 seconds until the run is over")
    status.add_argument("--web", action="store_true", help="serve a live page of the run (charts too); print its URL")
    status.add_argument("--host", default="127.0.0.1", help="with --web: interface to listen on (default 127.0.0.1; "
                        "any other needs a token)")
    status.add_argument("--port", type=int, default=0, help="with --web: port to listen on (default 0: a free one)")
    status.add_argument("--token", default=None, help="with --web: the token the page asks for (default: one is "
                        "generated when --host is not local)")

    repair = sub.add_parser("repair", help="move damaged lines of a run's results.jsonl to results.bad.jsonl")
    repair.add_argument("run", metavar="RUN_DIR_OR_RUN_ID", help="a run directory, or a run id under $ROLLOUT_HOME")

    images = sub.add_parser("images", help="build container images offline: the base image, per-instance images",
                            add_help=False)
    images.add_argument("rest", nargs=argparse.REMAINDER, help="base [--tag T] [--force] | build DATASET [...]")

    sub.add_parser("eval", help="grade a predictions file against a SWE dataset (rollout eval --help)", add_help=False)
    sub.add_parser("serve", help="deploy a config's serve section on Ray Serve; print its base URL", add_help=False)
    sub.add_parser("models", help="rollout models tiny DIR: the tiny CPU model", add_help=False)
    sub.add_parser("gym", help="NeMo Gym's contract: " + ", ".join(GYM), add_help=False)
    sub.add_parser("dev-cluster", help="separate machines on this one (root): up --nodes N | status | down",
                   add_help=False)
    sub.add_parser("report", help="write a run's report.html and summary.png again (rollout report --help)",
                   add_help=False)
    sub.add_parser("export", help="a run's rollouts as ATIF trajectory files or SFT rows (rollout export --help)",
                   add_help=False)
    sub.add_parser("check-tasks", help="Harbor task QA: oracle and nop on every task, the ones that disagree "
                   "reported (rollout check-tasks --help)", add_help=False)
    sub.add_parser("metrics", help="rollout metrics scrape-config: a Prometheus config for the farm's metrics",
                   add_help=False)

    gc = sub.add_parser("gc", help="remove containers left behind by dead runs (labelled rollout-farm.run)")
    gc.add_argument("--run", dest="run_id", default=None, help="only this run id")
    gc.add_argument("--older-than", default=None, help="only containers older than this, e.g. 30m, 2h, 1d")
    gc.add_argument("--engine", choices=["docker", "podman"], default="docker",
                    help="container engine to look in (default docker)")
    gc.add_argument("--force", action="store_true", help="also remove containers of processes still alive")

    fake = sub.add_parser("fake-server", help="serve scripted policies as an OpenAI-compatible endpoint")
    fake.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1; 0.0.0.0: all)")
    fake.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000; 0: a free one)")
    fake.add_argument("--policy", default="echo", type=policy_name,
                      help=f"the scripted policy that answers: one of {', '.join(POLICIES.names())} (default echo), "
                      "or a dotted path pkg.module:function")
    fake.add_argument("--latency", type=seconds, default=0.0, help="seconds per completion")
    fake.add_argument("--dataset", default=None, type=existing_file,
                      help="JSONL tasks the policy may look up by task id")
    fake.add_argument("--model", default="scripted", help="model name reported by the server")
    return parser


# ---- argument types: a bad value is an error naming its flag (``argument --policy: ...``), exit 2 -------------


def policy_name(text: str) -> str:
    """A scripted policy that loads: a short name of any package's table (``cluster.names.POLICIES``) or a path."""
    from cluster.names import POLICIES
    from rollout.errors import ConfigError

    try:
        POLICIES.load(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def port_number(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"seconds, 0 or more, got {text!r}")
    return value


def existing_file(text: str) -> str:
    if not Path(text).expanduser().is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def config_failure(exc: ConfigError) -> int:
    """One line per problem on stderr; exit code 2."""
    for line in str(exc).splitlines() or [""]:
        print(f"config error: {line}", file=sys.stderr)
    return 2
