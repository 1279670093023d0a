"""Memory over a long run: a batch job of many rollouts, the driver's and the Ray workers' RSS sampled throughout.

    python tests/perf/bench_memory.py [--rollouts 100000] [--quick] [--concurrency 256] [--latency 0.05]
                                      [--interval 2] [--no-trajectories] [--tracemalloc] [--keep]

The job is what a user runs for a long batch: ``rollout run CONFIG`` (here ``python -m cluster run``) in its own
process, on an embedded Ray cluster, with the Mini-SWE agent, the null runtime (``echo: true``) and the scripted
``bash_echo`` policy (S = 3 model calls per rollout) served by the scripted server in a process of its own (not part
of the system measured). The run directory is the default one: ``results.jsonl`` and a trajectory file per rollout.

Every ``--interval`` seconds the bench reads, from /proc, the RSS of the driver (the ``rollout run`` process), of
the Ray worker processes (``ray::*``: the rollout workers and any idle ones), of Ray's daemons and of the scripted
server, and counts the lines of ``results.jsonl`` (the rollouts finished so far, as the driver streamed them).
The table shows each group's RSS at the end of the warm-up (10 % of the rollouts, at most 10,000; in a short run
up to a quarter, at most 2,000: the workers take ~2,000 rollouts to settle) and at 25, 50,
75 and 100 % (each the mean of the three samples around that point), the rate over each stretch, and the growth
from the warm-up to the end. Target: growth <= 10 % for the driver and the workers (flat after the warm-up), with
every result on disk. The baseline is the warm-up's own figure, measured in the same run.

Each side did the work: the job's exit status, ``results.jsonl`` lines == the rollouts asked for, every line
``completed``/``submitted`` after 3 steps, and ``summary.json``'s count; a growth figure is printed only for a run
that did. ``--tracemalloc`` runs the driver under ``tracemalloc`` (slower) and prints, under the table, the top
allocation sites by line and the object types whose counts grew between the warm-up and 90 % of the rollouts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from _farm_bench_util import DRIVER, RAY, WORKERS, _read_stat, _tree, server_process  # beside this file

from rollout.wire.chat import raise_open_file_limit

MB = 1 << 20
STEPS = 3
"""Model calls per rollout of the bash_echo policy."""
SERVER = "scripted server"
GROUPS = (DRIVER, WORKERS, RAY, SERVER)
TARGET = 10.0
"""Allowed growth, in per cent, of the driver's and the workers' RSS from the warm-up to the end."""

TRACE_DRIVER = r"""
import gc, collections, sys, threading, time, tracemalloc
results, warm, end, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.argv = ["rollout"] + sys.argv[5:]
tracemalloc.start(1)

def lines():
    try:
        with open(results, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0

def watch():
    marks = []
    for goal in (warm, end):
        while lines() < goal:
            time.sleep(0.5)
        gc.collect()
        marks.append((tracemalloc.take_snapshot(), collections.Counter(type(o).__name__ for o in gc.get_objects())))
    (s0, c0), (s1, c1) = marks
    with open(out, "w") as f:
        f.write(f"tracemalloc, driver, {warm} -> {end} results on disk: top allocation sites by growth\n")
        for stat in s1.compare_to(s0, "lineno")[:20]:
            f.write(f"  {stat.size_diff / 1024:+10.0f} KiB {stat.count_diff:+8d} blocks  {stat.traceback[0]}\n")
        f.write("object types whose count grew the most (gc.get_objects)\n")
        grew = sorted(((c1[k] - c0.get(k, 0), k) for k in c1), reverse=True)[:15]
        f.write("".join(f"  {d:+9d}  {k} ({c1[k]})\n" for d, k in grew if d > 0))

threading.Thread(target=watch, daemon=True).start()
from cluster.cli.main import main
sys.exit(main())
"""


@dataclass
class Sample:
    t: float
    done: int
    rss: dict[str, int]
    workers: int
    """Ray worker processes alive."""


@dataclass
class Watch:
    """Samples the job's process tree and its results file every ``interval`` seconds from a thread."""

    root: int
    server: int
    results: str
    interval: float
    samples: list[Sample] = field(default_factory=list)
    _offset: int = 0
    _lines: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)
        self._thread.start()

    def done(self) -> int:
        """Lines of results.jsonl so far (read on from where the last call stopped)."""
        try:
            with open(self.results, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return self._lines
        cut = chunk.rfind(b"\n") + 1  # a line being written counts once it ends
        self._lines += chunk.count(b"\n", 0, cut)
        self._offset += cut
        return self._lines

    def sample(self) -> Sample:
        tree = _tree(self.root, {self.server}, {})  # command lines read afresh: a Ray worker renames itself
        rss: dict[str, int] = collections.defaultdict(int)
        workers = 0
        for _pid, (proc, group) in tree.items():
            rss[group] += proc.rss
            workers += group == WORKERS
        if (server := _read_stat(self.server)) is not None:
            rss[SERVER] = server.rss
        s = Sample(time.perf_counter() - self._t0, self.done(), dict(rss), workers)
        self.samples.append(s)
        return s

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def write_job(root: str, rollouts: int, url: str, concurrency: int, trajectories: bool) -> tuple[str, str]:
    """The dataset and the config of the job under ``root``; returns (config path, run directory)."""
    with open(os.path.join(root, "tasks.jsonl"), "w") as f:
        for i in range(rollouts):
            f.write(json.dumps({"task_id": f"t{i:06d}", "prompt": "Fix the bug in the repository."}) + "\n")
    run_dir = os.path.join(root, "run")
    config = {
        "run_id": "bench-memory",
        "model": {"type": "openai", "base_url": url, "model": "scripted", "timeout": 600},
        "agent": {"type": "mini_swe", "max_steps": 10},
        "environment": {"type": "shell"},
        "runtime": {"type": "null", "echo": True},
        "dataset": {"path": "tasks.jsonl"},
        "farm": {"backend": "ray"},
        "run": {"concurrency": concurrency, "max_attempts": 1, "progress_interval": 30},
        "output": {"dir": run_dir, "trajectories": trajectories},
    }
    path = os.path.join(root, "config.json")  # JSON is YAML
    with open(path, "w") as f:
        json.dump(config, f)
    return path, run_dir


def check_results(run_dir: str, rollouts: int, returncode: int) -> list[str]:
    """What says the job did not do the work: its exit status, missing or failed lines, summary.json's count."""
    problems = [] if returncode == 0 else [f"the job exited with status {returncode}"]
    bad, lines = collections.Counter(), 0
    with open(os.path.join(run_dir, "results.jsonl"), "rb") as f:
        for raw in f:
            lines += 1
            r = json.loads(raw)
            if (r["status"], r["exit_reason"], r.get("num_steps")) != ("completed", "submitted", STEPS):
                bad[f"{r['status']}/{r['exit_reason']}/{r.get('num_steps')} steps"] += 1
    if lines != rollouts:
        problems.append(f"results.jsonl has {lines} lines for {rollouts} rollouts")
    problems += [f"{n} rollouts {what}" for what, n in bad.items()]
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            counted = json.load(f)["rollouts"]["completed"]
    except (OSError, KeyError, ValueError) as exc:
        problems.append(f"no summary.json count: {exc}")
    else:
        if counted != rollouts:
            problems.append(f"summary.json counts {counted} completed rollouts of {rollouts}")
    return problems


def at(samples: list[Sample], goal: int, last: bool = False) -> tuple[Sample, dict[str, float]] | None:
    """The first sample with ``goal`` results on disk, and each group's mean RSS over it and the two before; for
    the ``last`` result, the three samples before it (once every result is on disk the job closes its workers)."""
    i = next((i for i, s in enumerate(samples) if s.done >= goal), None)
    if i is None or (last and i == 0):
        return None
    near = samples[max(0, i - 3):i] if last else samples[max(0, i - 2):i + 1]
    return near[-1], {g: sum(s.rss.get(g, 0) for s in near) / len(near) for g in GROUPS}


def table(samples: list[Sample], rollouts: int, warm: int, on_disk: int,
          problems: list[str]) -> tuple[list[str], bool]:
    """The checkpoint rows and the verdict lines; True when the driver and the workers stayed within TARGET."""
    head = f"{'point':<9} {'results':>8} {'time s':>7} {'rate/s':>7}" + "".join(f" {g + ' MB':>18}" for g in GROUPS)
    lines, points, last = [head, "-" * len(head)], {}, None
    goals = [("warm-up", warm)] + [(f"{q} %", rollouts * q // 100) for q in (25, 50, 75, 100)]
    for label, goal in goals:
        found = at(samples, goal, last=goal == rollouts)
        if found is None:
            lines.append(f"{label:<9} {'(not reached)':>8}")
            continue
        s, rss = points[label] = found
        if last is None:
            rate = f"{s.done / s.t:7.1f}"
        else:  # "-": the same sample as the row above (points closer than one interval)
            rate = f"{(s.done - last.done) / (s.t - last.t):7.1f}" if s.t > last.t else f"{'-':>7}"
        last = s
        mbs = "".join(f" {rss[g] / MB:>18.0f}" for g in GROUPS)
        lines.append(f"{label:<9} {s.done:>8} {s.t:>7.0f} {rate}{mbs}")
    ok = not problems and "warm-up" in points and "100 %" in points
    if not ok:
        lines.append("no growth figures: " + ("; ".join(problems) or "the run did not reach its warm-up and its end"))
        return lines, False
    (w, rss_w), (e, rss_e) = points["warm-up"], points["100 %"]
    flat = True
    for g in GROUPS:
        growth = 100 * (rss_e[g] - rss_w[g]) / rss_w[g] if rss_w[g] else float("nan")
        per = (rss_e[g] - rss_w[g]) / max(1, e.done - w.done)
        judged = g in (DRIVER, WORKERS)
        verdict = ("ok" if growth <= TARGET else "GROWS") if judged else "(not judged)"
        flat &= not judged or growth <= TARGET
        lines.append(f"growth {g:<16} {rss_w[g] / MB:7.0f} -> {rss_e[g] / MB:7.0f} MB  {growth:+6.1f} %  "
                     f"{per:+8.0f} B/rollout  target <= {TARGET:g} %: {verdict}")
    lines.append(f"rate after the warm-up {(e.done - w.done) / (e.t - w.t):.1f} rollouts/s; results.jsonl lines "
                 f"{on_disk} == rollouts completed {rollouts}: {'yes' if on_disk == rollouts else 'NO'}")
    return lines, flat


def after_notes(samples: list[Sample], rollouts: int) -> list[str]:
    """Peaks over the whole job, and over the end (summary, report) once every result was on disk."""
    notes = []
    for label, part in (("whole job", samples), ("after the last result", [s for s in samples if s.done >= rollouts])):
        if part:
            peaks = {g: max(s.rss.get(g, 0) for s in part) / MB for g in GROUPS}
            notes.append(f"peak RSS, {label}: " + ", ".join(f"{g} {v:.0f} MB" for g, v in peaks.items()))
    if samples:
        notes.append(f"Ray worker processes: {min(s.workers for s in samples)}..{max(s.workers for s in samples)}; "
                     f"{len(samples)} samples")
    return notes


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="5,000 rollouts (a smoke run)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latency", type=float, default=0.05, help="the scripted model's seconds per call")
    parser.add_argument("--interval", type=float, default=None, help="seconds between samples (default 2; 1 with "
                        "--quick)")
    parser.add_argument("--warmup", type=int, default=None, help="results before the baseline (default 10 %%, "
                        "at most 10,000; a quarter of a short run, at most 2,000)")
    parser.add_argument("--no-trajectories", action="store_true", help="output.trajectories: false")
    parser.add_argument("--tracemalloc", action="store_true", help="the driver under tracemalloc (slower)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (its path is printed)")
    args = parser.parse_args()
    rollouts = 5_000 if args.quick else args.rollouts
    interval = args.interval or (1.0 if args.quick else 2.0)
    warm = args.warmup if args.warmup is not None else min(10_000, max(rollouts // 10, min(2_000, rollouts // 4)))
    raise_open_file_limit()
    scratch = tempfile.mkdtemp(prefix="bench-memory-")
    trace_out = os.path.join(scratch, "tracemalloc.txt")
    before = load()
    with server_process(args.latency) as (url, server_pid):
        config, run_dir = write_job(scratch, rollouts, url, args.concurrency, not args.no_trajectories)
        cli = ["run", config, "--new-run"]
        trace_end = max(warm + 1, rollouts * 9 // 10)  # before the end: the summary then reads results.jsonl
        argv = ([sys.executable, "-c", TRACE_DRIVER, os.path.join(run_dir, "results.jsonl"), str(warm),
                 str(trace_end), trace_out, *cli] if args.tracemalloc else [sys.executable, "-m", "cluster", *cli])
        log_path = os.path.join(scratch, "job.log")
        print(f"{rollouts} rollouts, C={args.concurrency}, L={args.latency:g}s, S={STEPS}, null runtime; "
              f"job log {log_path}", flush=True)
        with open(log_path, "w") as log:
            job = subprocess.Popen(argv, cwd=scratch, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "ROLLOUT_HOME": scratch})
            watch = Watch(job.pid, server_pid, os.path.join(run_dir, "results.jsonl"), interval)
            try:
                returncode = job.wait()
            except KeyboardInterrupt:
                job.send_signal(signal.SIGINT)
                job.wait(timeout=120)
                raise
            finally:
                watch.stop()
    problems = check_results(run_dir, rollouts, returncode)
    lines, flat = table(watch.samples, rollouts, warm, watch.done(), problems)
    print(f"\nmemory over a long run: {rollouts} rollouts (`rollout run`, Ray, null runtime, scripted model), "
          f"trajectories {'off' if args.no_trajectories else 'on'}; load {before} -> {load()}")
    print("\n".join(lines))
    print("\n".join("  " + note for note in after_notes(watch.samples, rollouts)))
    if problems or returncode:
        with open(log_path) as f:
            print("job log (tail):\n" + "".join(f.readlines()[-30:]))
    if os.path.exists(trace_out):
        with open(trace_out) as f:
            print(f.read())
    if args.keep:
        print(f"run directory kept: {run_dir}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if flat and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
