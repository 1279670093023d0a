"""``rollout check-tasks DIR``: Harbor task QA. Every task runs twice through the farm, once with the ``oracle`` agent
(its ``solution/solve.sh``) and once with ``nop`` (nothing), and the tasks where the oracle does not reach reward 1
or nop does not get 0 are reported, with why (a verifier that wrote no reward, a build that failed, a reward off).
Exit 0 when every task passes, 1 when one does not, 2 for a bad directory or option.

The two runs are ordinary run directories (``$ROLLOUT_HOME/check-tasks/<DIR's name>-oracle`` and ``-nop``), so a
second check of an unchanged directory resumes and does nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from cluster.cli.parser import HelpParser
from rollout.errors import ConfigError

EXPECTED = {"oracle": 1.0, "nop": 0.0}


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="rollout check-tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="a directory of Harbor tasks, or one task")
    parser.add_argument("--runtime", choices=["docker", "podman"], default="docker", help="container engine")
    parser.add_argument("--concurrency", type=int, default=2, help="tasks checked at once (default 2)")
    parser.add_argument("--allow-network", action="store_true",
                        help="give tasks that ask for network_mode public the engine's bridge network")
    parser.add_argument("--reward-key", default="reward", help="the key of the rewards checked (default reward)")
    parser.add_argument("--ray", action="store_true", help="run on a Ray farm (default: in this process)")
    parser.add_argument("--out", default=None, help="where the two runs go (default $ROLLOUT_HOME/check-tasks)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from cluster.session.home import rollout_home

    tasks_dir = Path(args.dir).expanduser().resolve()
    out = Path(args.out).expanduser() if args.out else rollout_home() / "check-tasks"
    rows: dict[str, dict[str, Any]] = {}
    try:
        runnable, refused = screen(tasks_dir, args.allow_network)
        for agent in EXPECTED if runnable else ():
            run_dir = out / f"{tasks_dir.name}-{agent}"
            for row in _run(agent, tasks_dir, run_dir, args, runnable):
                rows.setdefault(row["task_id"], {})[agent] = row
    except ConfigError as exc:
        print(f"check-tasks: {exc}", file=sys.stderr)
        return 2
    bad = report(rows, args.reward_key, refused)
    return 1 if bad else 0


def screen(tasks_dir: Path, allow_network: bool) -> tuple[list[str], dict[str, str]]:
    """The tasks that can run here, and those that cannot (a task.toml that does not parse, several containers, a
    network not allowed) with the reason of each, as a linter names every problem rather than the first."""
    from envs.harbor.dataset import load_task, task_dirs
    from envs.harbor.env import check_tasks

    runnable, refused = [], {}
    for path in task_dirs(tasks_dir):
        try:
            check_tasks([load_task(path)], {"allow_network": allow_network})
        except ConfigError as exc:
            refused[path.name] = exc.message
        else:
            runnable.append(path.name)
    return runnable, refused


def _run(agent: str, tasks_dir: Path, run_dir: Path, args: argparse.Namespace,
         ids: list[str]) -> list[dict[str, Any]]:
    from cluster.run import job as jobs

    config = {
        "run_id": run_dir.name, "output": {"dir": str(run_dir.resolve())},
        "model": {"type": "scripted", "policy": "echo"}, "agent": {"type": agent},
        "environment": {"type": "harbor", "allow_network": args.allow_network},
        "runtime": {"type": args.runtime}, "verifier": {"type": "harbor", "reward_key": args.reward_key},
        "dataset": {"type": "harbor", "path": str(tasks_dir), "ids": ids},
        "run": {"samples": 1, "concurrency": args.concurrency, "max_attempts": 2, "progress_interval": 30},
        "farm": {"backend": "ray" if args.ray else "local"},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"check-tasks: {agent} on {tasks_dir} ...", file=sys.stderr, flush=True)
    job = jobs.prepare([str(path)], [], out=sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the run's table on stderr; the verdicts alone on stdout
            asyncio.run(jobs.execute(job))
    finally:
        job.store.close()
    last: dict[str, dict[str, Any]] = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            last[row["task_id"]] = row  # the last attempt of each task
    return list(last.values())


def verdict(row: dict[str, Any] | None, expected: float, key: str) -> str | None:
    """Why ``row`` is not what the agent should get, or None."""
    if row is None:
        return "did not run"
    if row.get("status") != "completed":
        error = row.get("error") or {}
        message = (error.get("message") or "").strip().splitlines()
        return f"{row.get('exit_reason')} ({row.get('failure_cause')}): {message[0][:200] if message else ''}"
    rewards = (row.get("reward_details") or {}).get("rewards") or {}
    value = rewards.get(key, row.get("reward"))
    if value != expected:
        return f"{key} = {value}, expected {expected:g}"
    return None


def report(rows: dict[str, dict[str, Any]], key: str, refused: dict[str, str] | None = None) -> list[str]:
    """Print one line per task (a task that cannot run here: why) and a total; the ids of the tasks that fail."""
    refused = refused or {}
    bad = []
    width = max([len(t) for t in [*rows, *refused]] + [4])
    print(f"{'task':<{width}}  oracle   nop  verdict")
    for task_id in sorted([*rows, *refused]):
        if task_id in refused:
            bad.append(task_id)
            print(f"{task_id:<{width}}  {'-':>6}  {'-':>4}  not run: {refused[task_id]}")
            continue
        problems = {agent: verdict(rows[task_id].get(agent), want, key) for agent, want in EXPECTED.items()}
        shown = {a: _reward(rows[task_id].get(a), key) for a in EXPECTED}
        why = "; ".join(f"{agent}: {p}" for agent, p in problems.items() if p)
        bad += [task_id] if why else []
        print(f"{task_id:<{width}}  {shown['oracle']:>6}  {shown['nop']:>4}  {why or 'ok'}")
    total = len(rows) + len(refused)
    print(f"{total - len(bad)} of {total} tasks pass (oracle reaches 1, nop gets 0)"
          + (f"; check: {', '.join(bad)}" if bad else ""))
    return bad


def _reward(row: dict[str, Any] | None, key: str) -> str:
    if row is None or row.get("status") != "completed":
        return "fail"
    value = ((row.get("reward_details") or {}).get("rewards") or {}).get(key, row.get("reward"))
    return "-" if value is None else f"{value:g}"
