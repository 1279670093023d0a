"""``rollout gym collect CONFIG... --input ROWS.jsonl --output OUT.jsonl [--num-repeats N] [--limit K] [k=v ...]``:
NeMo Gym's rollout collection, run on a ``RolloutFarm``.

- CONFIG: a run config as ``rollout run`` takes (``model``, ``agent``, ``environment`` such as ``{type: resources,
  url: ...}``, ``farm``, ``run``; no dataset), files merged in order, then ``key.path=value`` overrides.
- ROWS: NeMo Gym rows (``responses_create_params`` + task fields), one JSON object a line; every line is checked
  before any work (a bad one: exit 2 naming it). Task index: the row's ``_ng_task_index``, else its position.
- Each row runs N times, with the farm's concurrency and retries: repeat r is sample r of task ``t<task index>``
  (seed: ``run.seed`` + r). Each rollout is written as it finishes (``cluster.gym.collect_files``): OUT gets the
  verify reply, the sidecar ``<stem>_failures.jsonl`` one NeMo Gym ``RolloutFailure`` per failed attempt.
- Running the same command again resumes: pairs in OUT are skipped, non-terminal failures run again (the next
  ``episode_id.attempt``), terminal ones never; an OUT written from another input file is refused.

Progress on stderr every ``--progress`` seconds; the summary on stdout. Exit codes: 0 every rollout written; 2 bad
input, options or config, or a changed input (nothing written); 3 some rollouts failed (or never started); 130
interrupted (run the same command to resume).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cluster.cli.parser import HelpParser, config_failure
from cluster.gym.collect_files import CollectError, Ledger, Pair, check_stamp, read_rows, sidecar_and_stamp
from cluster.gym.rows import RowError, legacy_task
from rollout.errors import ConfigError

EXIT_BAD, EXIT_FAILED, EXIT_INTERRUPTED = 2, 3, 130


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="rollout gym collect", description="Run NeMo Gym rows through the farm "
                        "into a rollouts JSONL (and a failures sidecar); re-running resumes.")
    add = parser.add_argument
    add("items", nargs="+", metavar="CONFIG|key=value", help="run configs (merged in order), then key.path=value")
    add("--input", required=True, type=Path, metavar="ROWS.jsonl", help="NeMo Gym rows, one JSON object a line")
    add("--output", required=True, type=Path, metavar="OUT.jsonl", help="rollouts; failures in OUT_failures.jsonl")
    add("--num-repeats", type=int, default=1, metavar="N", help="rollouts per row (default 1)")
    add("--limit", type=int, default=None, metavar="K", help="only the first K rows")
    add("--local", action="store_true", help="run in this process, not on Ray (farm.backend=local)")
    add("--progress", type=float, default=10.0, metavar="SECONDS", help="progress on stderr this often (0: never)")
    return parser


def plan_calls(missing: dict[int, list[int]], n: int) -> list[tuple[list[int], int, int]]:
    """Farm calls (task indices, samples, first repeat) covering the missing pairs: the tasks missing every repeat
    in one call of n samples; each other repeat r in one call of one sample seeded as repeat r."""
    full = [t for t, repeats in missing.items() if len(repeats) == n]
    calls = [(full, n, 0)] if full else []
    for r in range(n):
        some = [t for t, repeats in missing.items() if len(repeats) < n and r in repeats]
        if some:
            calls.append((some, 1, r))
    return calls


async def collect(farm: Any, tasks: dict[int, Any], calls: list, ledger: Ledger, total: int, every: float) -> None:
    """The calls of ``plan_calls`` one after the other, each rollout to the ledger as it finishes; progress."""
    t0, before = time.monotonic(), total - sum(len(keys) * n for keys, n, _ in calls)

    async def tick() -> None:
        while every > 0:
            await asyncio.sleep(every)
            done, took = ledger.written + ledger.failed_now, time.monotonic() - t0
            print(f"collect: {before + done}/{total} rollouts ({done / took:.2f}/s), {ledger.failed_now} failed",
                  file=sys.stderr, flush=True)

    ticker = asyncio.create_task(tick())
    try:
        for keys, n, first in calls:
            async for result in farm.stream([tasks[t] for t in keys], n, seed=farm.seed + first):
                index = int(result.task_id[1:])
                ledger.add((index, first + result.sample_index), result, tasks[index].gym.row)
    finally:
        ticker.cancel()


def summarize(ledger: Ledger, pairs: list[Pair]) -> int:
    """The summary (stdout); the exit code."""
    missing = [p for p in pairs if p not in ledger.rewards]
    rewards = [ledger.rewards[p] for p in pairs if isinstance(ledger.rewards.get(p), (int, float))]
    mean = f"{sum(rewards) / len(rewards):.4f}" if rewards else "-"
    print(f"rollouts: {len(pairs) - len(missing)}/{len(pairs)} in {ledger.out} ({ledger.written} this run); "
          f"mean reward {mean}")
    kinds: Counter = Counter()
    for pair in missing:
        failure = (ledger.failures[pair][-1].get("failure") or {}) if pair in ledger.failures else None
        kind = "not started" if failure is None else failure.get("failure_kind") or f"{failure.get('stage')} stage"
        kinds[f"{kind}{' (terminal)' if ledger.terminal(pair) else ''}"] += 1
    if missing:
        print(f"failures: {len(missing)} not written: " + ", ".join(f"{k} x{v}" for k, v in kinds.most_common()))
    if ledger.sidecar.exists():
        print(f"failure records: {ledger.sidecar} ({sum(len(v) for v in ledger.failures.values())} attempt(s))")
    return EXIT_FAILED if missing else 0


def prepare(args: argparse.Namespace) -> tuple[Any, dict[int, Any], list[Pair], dict, bool]:
    """(the farm, unstarted; tasks by index; the planned pairs; the stamp; whether to write it): every check."""
    from cluster.cli.main import split_items
    from cluster.farm.rollout_farm import RolloutFarm

    if args.num_repeats < 1 or (args.limit is not None and args.limit < 1):
        raise CollectError("--num-repeats and --limit must be >= 1")
    rows, digest = read_rows(args.input, args.limit)
    paths, overrides = split_items(args.items)
    farm = RolloutFarm.from_config(paths, overrides + (["farm.backend=local"] if args.local else []))
    profiles = [name for name in farm.profiles() if name is not None]
    tasks = {}
    for number, index, row in rows:
        try:
            tasks[index] = legacy_task(row, f"t{index}", profiles=profiles)
        except RowError as exc:
            raise CollectError(f"{args.input} line {number}: {str(exc).replace('body', 'row', 1)}") from None
    stamp, new = check_stamp(args.output, digest)
    return farm, tasks, [(t, r) for t in tasks for r in range(args.num_repeats)], stamp, new


def main(argv: list[str]) -> int:
    args = build_parser().parse_intermixed_args(argv)
    try:
        farm, tasks, pairs, stamp, new = prepare(args)
        ledger = Ledger(args.output, stamp["run_id"])
    except (CollectError, ConfigError) as exc:
        if isinstance(exc, ConfigError):
            return config_failure(exc)
        print(exc, file=sys.stderr)
        return EXIT_BAD
    done = [p for p in pairs if p in ledger.rewards]
    terminal = {p for p in pairs if p not in ledger.rewards and ledger.terminal(p)}
    retried = [p for p in pairs if p not in ledger.rewards and p in ledger.failures and p not in terminal]
    for count, what in ((done, f"already in {args.output}"), (terminal, "failed for good (terminal): not retried"),
                        (retried, "failed before: running again")):
        if count:
            print(f"collect: {len(count)} rollout(s) {what}", file=sys.stderr)
    missing: dict[int, list[int]] = {}
    for t, r in (p for p in pairs if p not in ledger.rewards and p not in terminal):
        missing.setdefault(t, []).append(r)
    try:
        if new:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            sidecar_and_stamp(args.output)[1].write_text(json.dumps({**stamp, "input": args.input.name}) + "\n")
        if missing:
            print(f"collect: running {sum(map(len, missing.values()))} rollout(s) of {len(tasks)} row(s)",
                  file=sys.stderr, flush=True)
            farm.start()
            asyncio.run(collect(farm, tasks, plan_calls(missing, args.num_repeats), ledger, len(pairs),
                                args.progress))
    except KeyboardInterrupt:
        print(f"interrupted; finished rollouts are in {args.output}; run the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        ledger.close()
        farm.close()
    return summarize(ledger, pairs)
