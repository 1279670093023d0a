"""The farm end to end (RolloutFarm on an embedded Ray cluster) against baselines, in one run, one table.

    python tests/perf/bench_farm.py [--quick] [--only a b c] [--no-profile] [--all-workers]

Every rollout is the Mini-SWE loop (agents.swe_agent, envs.shell_env) over our OpenAI client against the fake
server (``bash_echo``: ``echo step 1``, ``echo step 2``, then submit: S = 3 model calls), which runs in its own
process so that it does not share a GIL with what is measured.

- (a) overhead per step, ``T*C/(R*S) - L`` (T wall, C rollouts in flight, R rollouts, S steps, L model latency):
  the farm (Ray backend, ``RolloutFarm.generate``) vs a plain asyncio loop (``asyncio.gather`` under a
  semaphore of C over ``run_rollout`` with the same client, agent, environment and null runtime).
  Target: farm <= 1.2x the loop and <= 3 ms.
- (b) peak throughput with real subprocesses (the ``local`` runtime), L = 0.5 s: the farm at its best window
  vs mini-swe-agent's batch runner at its best thread count. mini-swe-agent is driven as its SWE-bench batch
  runner drives it (a ThreadPoolExecutor; per instance ``get_model``, ``get_environment``, ``DefaultAgent.run``)
  with its text-based model (``litellm_textbased``, config ``swebench_backticks.yaml``) whose ``action_regex``
  is set to ```` ```bash ```` blocks so it reads the same responses; its ``LocalEnvironment`` submits on the same
  sentinel line. Trajectory and preds.json files, which its runner also writes, are left out (the farm keeps
  results in memory too), which only flatters the baseline. Target: farm >= 2x.
- (c) 30,000 rollouts with 10,000 in flight, L = 10 s, the null runtime: ideal 90 s by Little's law; target
  <= 112 s. The Ray worker and the driver are sampled with py-spy (if installed) in the steady state; the profile
  is printed when the target is missed.

Measured per figure: wall seconds; CPU seconds of the system under test (this process and the Ray processes it
started: workers and daemons; a process's CPU includes the subprocesses it reaped; see _farm_bench_util for how);
peak RSS (sampled every 0.5 s: this process plus the Ray worker processes; Ray's daemons in the notes). The fake
server is not part of the system; its CPU is in the notes. ``--quick`` runs small versions (a smoke test).
mini-swe-agent is optional: ``pip install mini-swe-agent`` (without it, (b) says so in the table).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper module beside this file

from _farm_bench_util import DRIVER, RAY, WORKERS, Probe, Usage, server_process, start_py_spy, summarize_profile  # noqa: E402

from rollout.gc_tuning import tune_gc  # noqa: E402
from rollout.models.openai_wire import raise_open_file_limit  # noqa: E402

PROMPT = "Fix the bug in the repository."
STEPS = 3
"""Model calls per rollout of the bash_echo policy."""
WARMUP = 8
"""Rollouts run before each measurement (worker started, modules imported, connections opened)."""
MB = 1 << 20


@dataclass
class Sizes:
    a_rollouts: int = 1024
    a_concurrency: int = 256
    a_latency: float = 1.0
    b_rollouts: int = 1000
    b_latency: float = 0.5
    b_windows: tuple[int, ...] = (256, 512, 1024)
    b_threads: tuple[int, ...] = (256, 64, 16)
    c_rollouts: int = 30_000
    c_concurrency: int = 10_000
    c_latency: float = 10.0
    c_target: float = 112.0


QUICK = Sizes(a_rollouts=128, a_concurrency=32, a_latency=0.2, b_rollouts=64, b_latency=0.2, b_windows=(32, 64),
              b_threads=(32, 8), c_rollouts=1200, c_concurrency=400, c_latency=1.0, c_target=9 * 112 / 90)


@dataclass
class Row:
    part: str
    system: str
    setting: str
    usage: Usage | None
    result: str
    target: str = ""
    verdict: str = ""
    notes: list[str] = field(default_factory=list)
    value: float = 0.0
    """The figure the target is about (ms per step, rollouts/s, seconds)."""
    rss_groups: tuple[str, ...] = (DRIVER,)
    cpu_groups: tuple[str, ...] = (DRIVER,)
    profile: list[str] = field(default_factory=list)
    """py-spy summaries of the farm's processes during this measurement (printed when the target is missed)."""


def tasks(n: int, prefix: str = "t") -> list[dict]:
    return [{"task_id": f"{prefix}{i:05d}", "prompt": PROMPT} for i in range(n)]


def failures(results: list[Any]) -> list[str]:
    """What went wrong, one line per rollout that did not submit after exactly STEPS steps."""
    bad = []
    for r in results:
        steps = len(r.trajectory.steps)
        if r.status != "completed" or r.exit_reason.value != "submitted" or steps != STEPS:
            error = f": {r.error.type}: {r.error.message[:200]}" if r.error else ""
            bad.append(f"{r.rollout_id} {r.status}/{r.exit_reason.value} after {steps} steps{error}")
    return bad


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def timing_notes(results: list[Any], latency: float) -> list[str]:
    """Where a rollout's time went beyond its S model latencies: inside ``run_rollout`` (agent, client, runtime)
    and, for the farm, the hop from the driver to the worker and back (``wall`` - ``total``: Ray's dispatch,
    argument and result serialisation, the wait for the worker's event loop)."""
    inside = [1000 * (r.timings.get("total", 0.0) - STEPS * latency) for r in results]
    notes = [f"run_rollout beyond S*L p50/p95 {pct(inside, 0.5):.0f}/{pct(inside, 0.95):.0f} ms"]
    hops = [1000 * (r.timings["wall"] - r.timings["total"]) for r in results if "wall" in r.timings]
    if hops:
        notes.append(f"driver-worker hop p50/p95 {pct(hops, 0.5):.0f}/{pct(hops, 0.95):.0f} ms")
    return notes


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# ---- the farm ---------------------------------------------------------------------------------------------


def farm_config(url: str, runtime: dict, run_id: str, concurrency: int) -> dict:
    return {
        "run_id": run_id,
        "model": {"type": "openai", "base_url": url, "model": "scripted", "timeout": 600},
        "agent": {"type": "mini_swe", "max_steps": 10},
        "environment": {"type": "shell"},
        "runtime": runtime,
        "farm": {"backend": "ray"},
        "run": {"concurrency": concurrency, "max_attempts": 1},
    }


class Profiler:
    """py-spy (``--nonblocking``, 50 Hz) on the Ray worker(s) and the driver from ``delay`` seconds into a
    measurement for ``seconds``; ``lines()`` after the measurement gives the summaries."""

    def __init__(self, delay: float, seconds: float):
        self.delay, self.seconds = delay, max(2.0, seconds)
        self.scratch = tempfile.mkdtemp(prefix="bench-farm-profile-")
        self.spies: list[tuple[str, str, Any]] = []
        self._timer: Any = None

    def __call__(self, worker_pids: list[int], probe: Probe) -> None:
        import threading

        def start() -> None:
            for label, pid in [("Ray worker", p) for p in worker_pids] + [("driver (this process)", os.getpid())]:
                out = os.path.join(self.scratch, f"{pid}-{time.monotonic_ns()}.txt")
                spy = start_py_spy(pid, self.seconds, out)
                if spy is not None:
                    probe.exclude.add(spy.pid)  # not part of the system measured; reaped after the probe
                    self.spies.append((label, out, spy))

        self._timer = threading.Timer(self.delay, start)
        self._timer.start()

    def lines(self) -> list[str]:
        if self._timer is not None:
            self._timer.cancel()
        if self._timer is not None and not self.spies:
            return ["no profile: py-spy is not installed (pip install py-spy), or the run ended before it started"]
        out = []
        for label, path, spy in self.spies:
            _, err = spy.communicate(timeout=self.seconds + 60)
            out.append(f"py-spy of the {label}, {self.seconds:g} s from {self.delay:g} s into the measurement:")
            out += summarize_profile(path) if spy.returncode == 0 else [f"  (py-spy failed: {err.strip()[-300:]})"]
        return out


def run_farm(url: str, server_pid: int, runtime: dict, run_id: str, rollouts: int, concurrency: int, latency: float,
             profile: Profiler | None = None) -> tuple[Usage, list[str], dict]:
    """One measured ``farm.generate`` of ``rollouts`` fresh tasks after a warm-up call on the same farm."""
    from cluster import RolloutFarm

    farm = RolloutFarm.from_config(farm_config(url, runtime, run_id, concurrency), concurrency=concurrency)
    try:
        farm.start()
        bad = failures(farm.generate(tasks(WARMUP, "warm")).results)
        if bad:
            raise SystemExit(f"{run_id}: the warm-up failed: {bad[0]}")
        info = {"workers": [w["pid"] for w in farm.workers()]}
        with Probe(exclude={server_pid}, watch={server_pid}) as probe:
            if profile is not None:
                profile(info["workers"], probe)
            batch = farm.generate(tasks(rollouts))
        info["profile"] = profile.lines() if profile is not None else []
        info["timings"] = timing_notes(batch.results, latency)
        return probe.usage, failures(batch.results), info
    finally:
        farm.close()


# ---- (a) overhead per step --------------------------------------------------------------------------------


async def loop_rollouts(url: str, rollouts: int, concurrency: int, latency: float) -> tuple[Usage, list[str], list[str]]:
    """The plain asyncio loop: the same parts as the farm's worker builds, without the farm."""
    from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
    from envs.null_runtime import NullRuntime, NullRuntimeConfig
    from envs.shell_env import ShellEnvironment
    from rollout.models.openai_client import OpenAIModel, OpenAIModelConfig
    from rollout.records import RequestMeta, Task
    from rollout.runner import run_rollout

    model = OpenAIModel(OpenAIModelConfig(base_url=url, model="scripted", timeout=600))
    agent = MiniSweAgent(MiniSweAgentConfig(max_steps=10))
    runtime_config = NullRuntimeConfig(echo=True)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(row: dict) -> Any:
        async with semaphore:
            task = Task.model_validate(row)
            env = ShellEnvironment(NullRuntime(runtime_config))
            meta = RequestMeta(rollout_id=f"{task.task_id}#0", task_id=task.task_id, run_id="loop")
            return await run_rollout(task, agent, model, env, meta=meta, limits=agent.limits())

    try:
        bad = failures(await asyncio.gather(*(one(t) for t in tasks(WARMUP, "warm"))))
        if bad:
            raise SystemExit(f"loop: the warm-up failed: {bad[0]}")
        with Probe() as probe:
            results = await asyncio.gather(*(one(t) for t in tasks(rollouts)))
    finally:
        await model.aclose()
    return probe.usage, failures(results), timing_notes(results, latency)


def part_a(sizes: Sizes, profile: bool) -> list[Row]:
    r, c, latency = sizes.a_rollouts, sizes.a_concurrency, sizes.a_latency
    setting = f"R={r} C={c} L={latency:g}s S={STEPS}"

    def overhead(usage: Usage) -> float:
        return usage.wall * c / (r * STEPS) - latency

    rows = []
    with server_process(latency) as (url, server_pid):
        before = load()
        usage, bad, timings = asyncio.run(loop_rollouts(url, r, c, latency))
        loop = Row("a", "asyncio loop (baseline)", setting, usage, f"{1000 * overhead(usage):.2f} ms/step",
                   "baseline", "", timings + [f"load {before}->{load()}"], value=overhead(usage))
        loop.notes += failed_note(bad)
        rows.append(loop)
        before = load()
        ideal = -(-r // c) * STEPS * latency
        spy = Profiler(ideal / 4, ideal / 2) if profile else None
        usage, bad, info = run_farm(url, server_pid, {"type": "null", "echo": True}, "bench-a", r, c, latency, spy)
        farm = Row("a", "farm (ray)", setting, usage, f"{1000 * overhead(usage):.2f} ms/step",
                   "<= 3 ms and <= 1.2x loop", "", info["timings"] + [f"load {before}->{load()}"], value=overhead(usage),
                   rss_groups=(DRIVER, WORKERS), cpu_groups=(DRIVER, WORKERS, RAY), profile=info["profile"])
        farm.notes += failed_note(bad)
        ratio = farm.value / loop.value if loop.value > 0 else float("inf")
        farm.result += f" ({ratio:.2f}x loop)" if loop.value > 0 else " (loop overhead <= 0)"
        farm.verdict = "pass" if farm.value <= 0.003 and farm.value <= 1.2 * max(loop.value, 0) and not bad else "MISS"
        rows.append(farm)
    return rows


# ---- (b) peak throughput ----------------------------------------------------------------------------------


def mini_swe_agent_missing() -> str | None:
    """Why mini-swe-agent cannot run here, or None."""
    try:
        import minisweagent  # noqa: F401
        import litellm  # noqa: F401
    except ImportError as exc:
        return f"mini-swe-agent is not installed ({exc}); install it with: {sys.executable} -m pip install mini-swe-agent"
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason too
        return f"mini-swe-agent does not import: {type(exc).__name__}: {exc}"
    return None


def mini_swe_environment() -> None:
    """Its settings, before its first import: no cost lookups, no banner, no network for litellm's price list,
    its global config in a scratch directory."""
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-config-"))


def run_mini_swe_agent(url: str, rollouts: int, threads: int, workdir: str) -> tuple[Usage, list[str]]:
    """mini-swe-agent's batch runner, minus its files and progress display."""
    import logging

    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_from_spec
    from minisweagent.environments import get_environment
    from minisweagent.models import get_model
    from minisweagent.utils.serialize import recursive_merge

    logging.getLogger("litellm").setLevel(logging.WARNING)
    base = get_config_from_spec("swebench_backticks.yaml")
    model_config = recursive_merge(base["model"], {
        "model_class": "litellm_textbased", "model_name": "openai/scripted", "cost_tracking": "ignore_errors",
        "model_kwargs": {"api_base": url, "api_key": "unused"}, "action_regex": r"```bash\s*\n(.*?)\n```",
    })
    env_config = recursive_merge(base["environment"], {"environment_class": "local", "cwd": workdir, "timeout": 30})
    env_config.pop("interpreter", None)  # a docker-environment field

    def one(i: int) -> str | None:
        model = get_model(config=model_config)
        agent = DefaultAgent(model, get_environment(env_config), **base["agent"])
        try:
            info = agent.run(PROMPT)
        except Exception as exc:  # noqa: BLE001 - reported like the batch runner's exit status
            return f"instance {i}: {type(exc).__name__}: {exc}"
        if info.get("exit_status") != "Submitted" or agent.n_calls != STEPS:
            return f"instance {i}: {info.get('exit_status')} after {agent.n_calls} calls"
        return None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        bad = [b for b in pool.map(one, range(WARMUP)) if b]
        if bad:
            raise SystemExit(f"mini-swe-agent: the warm-up failed: {bad[0]}")
        with Probe() as probe:
            bad = [b for b in pool.map(one, range(rollouts)) if b]
    return probe.usage, bad


def part_b(sizes: Sizes, all_workers: bool, profile: bool) -> list[Row]:
    n, latency = sizes.b_rollouts, sizes.b_latency
    runtime = {"type": "local", "allow_host_exec": True}  # the commands are the scripted policy's echo
    farm_rows, mini_rows = [], []
    with server_process(latency) as (url, server_pid):
        for window in sizes.b_windows:
            before = load()
            ideal = -(-n // window) * STEPS * latency
            spy = Profiler(ideal / 2, 2 * ideal) if profile else None
            usage, bad, info = run_farm(url, server_pid, runtime, f"bench-b{window}", n, window, latency, spy)
            row = Row("b", "farm (ray), local runtime", f"{n} rollouts, window {window}, L={latency:g}s", usage,
                      f"{n / usage.wall:.1f} rollouts/s", "", "", info["timings"] + [f"load {before}->{load()}"],
                      value=n / usage.wall, rss_groups=(DRIVER, WORKERS), cpu_groups=(DRIVER, WORKERS, RAY), profile=info["profile"])
            row.notes += failed_note(bad)
            farm_rows.append(row)
        missing = mini_swe_agent_missing() if "minisweagent" not in sys.modules else None
        if missing is not None:
            mini_rows.append(Row("b", "mini-swe-agent batch runner", "-", None, "not run", "", "", [missing]))
        else:
            best = 0.0
            with tempfile.TemporaryDirectory(prefix="mswea-work-") as workdir:
                for threads in sorted(sizes.b_threads, reverse=True):
                    setting = f"{n} rollouts, {threads} threads, L={latency:g}s"
                    bound = threads / (STEPS * latency)
                    if not all_workers and best > bound:
                        mini_rows.append(Row("b", "mini-swe-agent batch runner", setting, None, "skipped", "", "", [
                            f"cannot be its best: Little's law caps {threads} threads at {bound:.1f} rollouts/s "
                            f"< {best:.1f} measured (--all-workers runs it)"]))
                        continue
                    before = load()
                    usage, bad = run_mini_swe_agent(url, n, threads, workdir)
                    row = Row("b", "mini-swe-agent batch runner", setting, usage, f"{n / usage.wall:.1f} rollouts/s",
                              "", "", [f"load {before}->{load()}"], value=n / usage.wall)
                    row.notes += failed_note(bad)
                    best = max(best, row.value)
                    mini_rows.append(row)
    best_farm = max(farm_rows, key=lambda r: r.value)
    measured = [r for r in mini_rows if r.usage is not None]
    best_farm.target = ">= 2x mini-swe-agent"
    if measured:
        best_mini = max(measured, key=lambda r: r.value)
        best_mini.target = "baseline (its best)"
        ratio = best_farm.value / best_mini.value
        best_farm.result += f" ({ratio:.2f}x)"
        clean = not any("failed" in note for note in best_farm.notes + best_mini.notes)
        best_farm.verdict = "pass" if ratio >= 2 and clean else "MISS"
    else:
        best_farm.verdict = "n/a"
    for row in farm_rows:
        if row is not best_farm:
            row.target = "(not the best window)"
    return farm_rows + mini_rows


# ---- (c) 10,000 in flight ---------------------------------------------------------------------------------


def part_c(sizes: Sizes, profile: bool) -> list[Row]:
    r, c, latency = sizes.c_rollouts, sizes.c_concurrency, sizes.c_latency
    ideal = -(-r // c) * STEPS * latency
    with server_process(latency) as (url, server_pid):
        before = load()
        spy = Profiler(ideal / 3, ideal / 3) if profile else None
        usage, bad, info = run_farm(url, server_pid, {"type": "null", "echo": True}, "bench-c", r, c, latency, spy)
    row = Row("c", "farm (ray), null runtime", f"R={r} C={c} L={latency:g}s S={STEPS}", usage,
              f"{usage.wall:.1f} s (ideal {ideal:g} s, {usage.wall / ideal:.2f}x)", f"<= {sizes.c_target:g} s", "",
              info["timings"] + [f"load {before}->{load()}"], value=usage.wall, rss_groups=(DRIVER, WORKERS),
              cpu_groups=(DRIVER, WORKERS, RAY), profile=info["profile"])
    row.notes += failed_note(bad)
    row.verdict = "pass" if usage.wall <= sizes.c_target and not bad else "MISS"
    return [row]


# ---- the table --------------------------------------------------------------------------------------------


def failed_note(bad: list[str]) -> list[str]:
    return [f"{len(bad)} failed, e.g. {bad[0]}"] if bad else []


def usage_notes(row: Row, server_pid_cpu: bool = True) -> list[str]:
    u = row.usage
    if u is None:
        return []
    notes = []
    groups = (DRIVER, WORKERS, RAY) if WORKERS in row.cpu_groups else (DRIVER,)
    if WORKERS in row.cpu_groups:
        notes.append("cpu s " + " + ".join(f"{g} {u.cpu.get(g, 0.0):.1f}" for g in groups))
        notes.append("rss MB " + " + ".join(f"{g} {u.peak_rss.get(g, 0) / MB:.0f}" for g in groups))
    notes.append("cores avg/peak " + ", ".join(
        f"{g} {u.cpu.get(g, 0.0) / u.wall:.2f}/{u.peak_cores.get(g, 0.0):.2f}" for g in groups[:2]))
    if u.extra_cpu and server_pid_cpu:
        notes.append(f"fake server cpu {sum(u.extra_cpu.values()):.1f} s, peak {u.peak_cores.get('watched', 0.0):.2f} "
                     "cores")
    return notes


def print_table(rows: list[Row]) -> None:
    header = ("part", "system", "setting", "wall s", "CPU s", "peak RSS MB", "result", "target", "pass", "notes")
    lines = [header]
    for row in rows:
        u = row.usage
        cells = (row.part, row.system, row.setting,
                 f"{u.wall:.2f}" if u else "-",
                 f"{u.cpu_of(*row.cpu_groups):.1f}" if u else "-",
                 f"{u.peak_rss_of.get(row.rss_groups, 0) / MB:.0f}" if u else "-",
                 row.result, row.target, row.verdict, "; ".join(usage_notes(row) + row.notes))
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(line, widths)) + " | " + line[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small versions of every part (a smoke test)")
    parser.add_argument("--only", choices=["a", "b", "c"], nargs="+", help="run only these parts")
    parser.add_argument("--no-profile", action="store_true", help="do not sample the farm's processes with py-spy")
    parser.add_argument("--ray-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set before Ray starts, so its processes inherit it (A/B runs, e.g. RAY_USE_UVLOOP=0)")
    parser.add_argument("--all-workers", action="store_true",
                        help="run every mini-swe-agent thread count, even those Little's law rules out as its best")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    parts = args.only or ["a", "b", "c"]
    if os.environ.pop("RAY_ADDRESS", None):
        print("RAY_ADDRESS ignored: the farm runs on an embedded local cluster", file=sys.stderr)
    for item in args.ray_env:
        key, _, value = item.partition("=")
        os.environ[key] = value
    raise_open_file_limit()  # before Ray starts: its processes inherit the limit (10,000 sockets in (c))
    tune_gc()  # as `rollout run` does (the farm's workers tune their own)
    if "b" in parts:
        mini_swe_environment()
        if mini_swe_agent_missing() is None:
            import minisweagent.models  # noqa: F401 - imported now (seconds of litellm), not inside a measurement
    rows: list[Row] = []
    profile = not args.no_profile
    t0, load0 = time.perf_counter(), load()
    if "a" in parts:
        rows += part_a(sizes, profile)
    if "b" in parts:
        rows += part_b(sizes, args.all_workers, profile)
    if "c" in parts:
        rows += part_c(sizes, profile)
    print_table(rows)
    print(f"total {time.perf_counter() - t0:.0f} s on {os.cpu_count()} CPUs; load average (1/5/15 min) "
          f"{load0} at the start, {load()} at the end" + (f"; {', '.join(args.ray_env)}" if args.ray_env else ""))
    missed = [r for r in rows if r.verdict == "MISS"]
    for row in missed:
        if row.profile:
            print(f"\n({row.part}) {row.system}, {row.setting}: missed its target; where the time goes:")
            print("\n".join(row.profile))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
