"""The farm end to end (RolloutFarm on an embedded Ray cluster) against baselines, in one run, one table.

    python tests/perf/bench_farm.py [--quick] [--only a b c] [--budget 540] [--no-profile] [--all-workers]
                                    [--ray-env KEY=VALUE]

Every rollout is the Mini-SWE loop (agents.swe_agent, envs.shell_env) over our OpenAI client against the fake
server (``bash_echo``: ``echo step 1``, ``echo step 2``, then submit: S = 3 model calls), which runs in its own
process so that it does not share a GIL with what is measured.

- (a) overhead per step, ``T*C/(R*S) - L`` (T wall, C rollouts in flight, R rollouts, S steps, L model latency):
  the farm (Ray backend, ``RolloutFarm.generate``) vs a plain asyncio loop (``asyncio.gather`` under a
  semaphore of C over ``run_rollout`` with the same client, agent, environment and null runtime).
  Target: farm <= 1.2x the loop and <= 3 ms per step beyond it. The notes give the Ray call floor (a plain
  actor's method, round trip) beside the farm's driver-worker hop, and the farm's wall time beyond the loop's: a
  cost per run (the first rollouts' trip to the worker, the last results' trip back), which T*C/(R*S) spreads
  over R*S steps. R = 4096 (16 rounds of C): at 1024 that fixed 0.1 s alone came to 8 ms a step.
- (b) peak throughput with real subprocesses (the ``local`` runtime), L = 0.5 s: the farm at its best window and
  worker count (one or two worker processes on the node, ``farm.workers_per_node``)
  vs mini-swe-agent's batch runner at its best thread count. mini-swe-agent is driven as its SWE-bench batch
  runner drives it (a ThreadPoolExecutor; per instance ``get_model``, ``get_environment``, ``DefaultAgent.run``)
  with its text-based model (``litellm_textbased``, config ``swebench_backticks.yaml``) whose ``action_regex``
  is set to ```` ```bash ```` blocks so it reads the same responses; its ``LocalEnvironment`` submits on the same
  sentinel line. Trajectory and preds.json files, which its runner also writes, are left out (the farm keeps
  results in memory too), which only flatters the baseline. It runs in a fresh process per thread count (none
  of Ray's threads or the farm's heap in its way) with a 60 s request timeout (litellm's default is 600 s).
  Thread counts Little's law rules out as its best are skipped, and so are further windows / thread counts
  that would pass ``--budget`` (parts run in the order a, c, b). Its floor, measured first: bare
  ``bash -c`` spawns from a plain asyncio loop (64 at a time), over the 3 commands of a rollout. Targets: farm
  >= 0.8x the floor and >= 2x mini-swe-agent; no ratio is printed against a side that failed rollouts.
- (c) 30,000 rollouts with 10,000 in flight, L = 10 s, the null runtime: ideal 90 s by Little's law; target
  <= 99 s (1.1x). The Ray worker and the driver are sampled with py-spy (if installed) in the steady state; the profile
  is printed when the target is missed.

Measured per figure: wall seconds; CPU seconds of the system under test (this process and the Ray processes it
started: workers and daemons; a process's CPU includes the subprocesses it reaped; see _farm_bench_util for how);
peak RSS (sampled every 0.5 s: this process plus the Ray worker processes; Ray's daemons in the notes). The fake
server is not part of the system; its CPU is in the notes. ``--quick`` runs small versions (a smoke test).
mini-swe-agent is optional: ``pip install mini-swe-agent`` (without it, (b) says so in the table). The notes also
split each rollout's time (see ``timing_notes``) and give each process group's average and busiest-second use
in cores; ``--ray-env KEY=VALUE`` sets a variable before Ray starts, for A/B runs of a Ray setting.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from _farm_bench_util import (  # beside this file: a script's directory is on sys.path
    DRIVER,
    RAY,
    WORKERS,
    Probe,
    Usage,
    server_process,
    server_stats,
    start_py_spy,
    summarize_profile,
)

from rollout.gc_tuning import tune_gc
from rollout.wire.chat import raise_open_file_limit

PROMPT = "Fix the bug in the repository."
STEPS = 3
"""Model calls per rollout of the bash_echo policy."""
WARMUP = 8
"""Rollouts run before each measurement (worker started, modules imported, connections opened)."""
MB = 1 << 20


@dataclass
class Sizes:
    a_rollouts: int = 4096
    a_concurrency: int = 256
    a_latency: float = 1.0
    b_rollouts: int = 1000
    b_latency: float = 0.5
    b_windows: tuple[tuple[int, int], ...] = ((1024, 2), (1024, 1), (512, 1), (256, 1))
    """(window, worker processes on the node): each command is a process the worker spawns and reaps, so one
    event loop is the limit; ``farm.workers_per_node: 2`` puts the second core to work."""
    b_threads: tuple[int, ...] = (256, 64, 16)
    c_rollouts: int = 30_000
    c_concurrency: int = 10_000
    c_latency: float = 10.0
    c_target: float = 99.0
    """1.1x the ideal (Little's law: 90 s)."""


QUICK = Sizes(a_rollouts=128, a_concurrency=32, a_latency=0.2, b_rollouts=64, b_latency=0.2,
              b_windows=((64, 2), (32, 1)),
              b_threads=(32, 8), c_rollouts=1200, c_concurrency=400, c_latency=1.0, c_target=9 * 1.1)


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
    order: int = 0
    """Position among the rows of its system (the window or thread count)."""
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


def timing_notes(results: list[Any], latency: float, received: dict[str, float] | None = None) -> list[str]:
    """Where a rollout's time went beyond its S model latencies: inside ``run_rollout`` (agent, client, runtime)
    and, for the farm, the hop from the driver to the worker and back (``wall`` - ``total`` - ``queued``, the wait
    on the worker for a slot of a rollout sent ahead, which the notes give apart: Ray's dispatch,
    argument and result serialisation, the waits for the worker's and the driver's event loops). With the
    driver's receipt times (``received``, wall clock) the hop splits into "in" (dispatch to the first model call)
    and "out" (end of the last step to the driver), from the steps' wall-clock ``started_at``."""
    inside = [1000 * (r.timings.get("total", 0.0) - STEPS * latency) for r in results]
    notes = [f"run_rollout beyond S*L p50/p95 {pct(inside, 0.5):.0f}/{pct(inside, 0.95):.0f} ms"]
    queued = [1000 * r.timings["queued"] for r in results if "queued" in r.timings]
    if queued:  # sent ahead of a free slot, it waited on its worker: not part of the hop
        notes.append(f"waited on the worker for a slot p50/p95 {pct(queued, 0.5):.0f}/{pct(queued, 0.95):.0f} ms")
    hops = [1000 * (r.timings["wall"] - r.timings["total"] - r.timings.get("queued", 0.0))
            for r in results if "wall" in r.timings]
    if hops:
        notes.append(f"driver-worker hop p50/p95 {pct(hops, 0.5):.0f}/{pct(hops, 0.95):.0f} ms")
    if received:
        hop_in, hop_out = [], []
        for r in results:
            got, steps = received.get(r.rollout_id), r.trajectory.steps
            if got is None or not steps or "wall" not in r.timings:
                continue
            hop_in.append(1000 * (steps[0].started_at - (got - r.timings["wall"]) - r.timings.get("queued", 0.0)))
            last = steps[-1]
            hop_out.append(1000 * (got - (last.started_at + last.model_seconds + last.env_seconds)))
        notes.append(f"of which in p50/p95 {pct(hop_in, 0.5):.0f}/{pct(hop_in, 0.95):.0f} ms, "
                     f"out {pct(hop_out, 0.5):.0f}/{pct(hop_out, 0.95):.0f} ms")
    return notes


def served(url: str) -> str:
    """What the scripted server saw since its counters were last reset (retries show as extra requests)."""
    stats = server_stats(url)
    errors = sum(n for code, n in stats["by_status"].items() if code != "200")
    return f"server saw {stats['requests']} requests ({errors} errors), max {stats['max_in_flight']} in flight"


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# ---- the farm ---------------------------------------------------------------------------------------------


def farm_config(url: str, runtime: dict, run_id: str, concurrency: int, workers_per_node: int | None = None) -> dict:
    farm = {"backend": "ray"} if workers_per_node is None else {"backend": "ray", "workers_per_node": workers_per_node}
    return {
        "run_id": run_id,
        "model": {"type": "openai", "base_url": url, "model": "scripted", "timeout": 600},
        "agent": {"type": "mini_swe", "max_steps": 10},
        "environment": {"type": "shell"},
        "runtime": runtime,
        "farm": farm,
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
        shutil.rmtree(self.scratch, ignore_errors=True)
        return out


def run_farm(url: str, server_pid: int, runtime: dict, run_id: str, rollouts: int, concurrency: int, latency: float,
             profile: Profiler | None = None, workers_per_node: int | None = None) -> tuple[Usage, list[str], dict]:
    """One measured ``farm.generate`` of ``rollouts`` fresh tasks after a warm-up call on the same farm."""
    from cluster import RolloutFarm

    config = farm_config(url, runtime, run_id, concurrency, workers_per_node)
    farm = RolloutFarm.from_config(config, concurrency=concurrency)
    try:
        farm.start()
        bad = failures(farm.generate(tasks(WARMUP, "warm")).results)
        if bad:
            raise SystemExit(f"{run_id}: the warm-up failed: {bad[0]}")
        info: dict[str, Any] = {"workers": [w["pid"] for w in farm.workers()]}
        received: dict[str, float] = {}
        server_stats(url, reset=True)
        with Probe(exclude={server_pid}, watch={server_pid}) as probe:
            if profile is not None:
                profile(info["workers"], probe)
            run = getattr(farm, "_run", None)  # farm.generate is farm._run(farm.agenerate(...)): called so to see
            if run is not None:                # when each result reaches the driver
                batch = run(farm.agenerate(tasks(rollouts), on_result=lambda r: received.__setitem__(
                    r.rollout_id, time.time())))
            else:
                batch = farm.generate(tasks(rollouts))
        info["profile"] = profile.lines() if profile is not None else []
        info["timings"] = timing_notes(batch.results, latency, received) + [served(url)] + ray_call_floor(farm)
        return probe.usage, failures(batch.results), info
    finally:
        farm.close()


def ray_call_floor(farm: Any) -> list[str]:
    """What one Ray actor call costs on this cluster, round trip, from the farm's own event loop: a plain actor's
    method that returns at once (the floor: Ray's dispatch, one argument and one result), and the worker's
    ``collect(0.01)`` (the results long-poll, here with nothing to collect: it returns after 10 ms)."""
    import ray

    backend = getattr(farm, "_backend", None)
    actors = backend.workers() if backend is not None and hasattr(backend, "workers") else []
    if not actors:
        return []

    @ray.remote(num_cpus=0)
    class Plain:
        def ping(self, x: Any = None) -> Any:
            return x

    async def rounds(call: Any, n: int = 30) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await call()
            times.append(1000 * (time.perf_counter() - t0))
        return pct(times, 0.5)

    plain = Plain.remote()
    try:
        farm._run(rounds(lambda: plain.ping.remote(), 3))  # started and warm
        ping = farm._run(rounds(lambda: plain.ping.remote()))
    finally:
        ray.kill(plain)
    poll = farm._run(rounds(lambda: actors[0].collect.remote(0.01)))
    return [f"Ray call floor p50: a plain actor's method {ping:.1f} ms; the worker's collect(10 ms) {poll:.1f} ms"]


# ---- (a) overhead per step --------------------------------------------------------------------------------


async def loop_rollouts(url: str, rollouts: int, concurrency: int,
                        latency: float) -> tuple[Usage, list[str], list[str]]:
    """The plain asyncio loop: the same parts as the farm's worker builds, without the farm."""
    from agents.swe_agent import MiniSweAgent, MiniSweAgentConfig
    from envs.runtimes.null import NullRuntime, NullRuntimeConfig
    from envs.shell_env import ShellEnvironment
    from rollout.models.client.model import OpenAIModel, OpenAIModelConfig
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
        server_stats(url, reset=True)
        with Probe() as probe:
            results = await asyncio.gather(*(one(t) for t in tasks(rollouts)))
    finally:
        await model.aclose()
    return probe.usage, failures(results), timing_notes(results, latency) + [served(url)]


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
        loop_bad = bool(bad)
        rows.append(loop)
        before = load()
        ideal = -(-r // c) * STEPS * latency
        spy = Profiler(ideal / 4, ideal / 2) if profile else None
        usage, bad, info = run_farm(url, server_pid, {"type": "null", "echo": True}, "bench-a", r, c, latency, spy)
        farm = Row("a", "farm (ray)", setting, usage, f"{1000 * overhead(usage):.2f} ms/step",
                   "<= 1.2x loop and <= loop + 3 ms", "", info["timings"] + [f"load {before}->{load()}"],
                   value=overhead(usage), rss_groups=(DRIVER, WORKERS), cpu_groups=(DRIVER, WORKERS, RAY),
                   profile=info["profile"])
        farm.notes.insert(0, f"wall beyond the loop's {usage.wall - loop.usage.wall:+.2f} s "
                             "(a cost per run, not per step)")
        farm.notes += failed_note(bad)
        rows.append(farm)
        if loop_bad or bad:  # a side that did not do the work gets no ratio
            farm.result += f" (no ratio: {'the loop' if loop_bad else 'the farm'} failed rollouts)"
            farm.verdict = "MISS"
            return rows
        ratio = farm.value / loop.value if loop.value > 0 else float("inf")
        beyond = farm.value - loop.value
        farm.result += f" ({ratio:.2f}x loop, {1000 * beyond:+.2f} ms)" if loop.value > 0 else " (loop overhead <= 0)"
        farm.verdict = "pass" if beyond <= 0.003 and farm.value <= 1.2 * max(loop.value, 0) else "MISS"
    return rows


# ---- (b) peak throughput ----------------------------------------------------------------------------------


MINI_SWE_ENV = {
    "MSWEA_COST_TRACKING": "ignore_errors",  # no price for a fake model: not an error
    "MSWEA_SILENT_STARTUP": "1",  # no banner
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's price list from the package, not the network
}
"""mini-swe-agent's settings, read at its import (its global config goes to a scratch directory too)."""


def mini_swe_agent_missing() -> str | None:
    """Why mini-swe-agent cannot run here, or None (found without importing it: litellm takes seconds)."""
    from importlib.util import find_spec

    absent = [name for name in ("minisweagent", "litellm") if find_spec(name) is None]
    if absent:
        return (f"mini-swe-agent is not installed ({', '.join(absent)} missing); install it with: "
                f"{sys.executable} -m pip install mini-swe-agent")
    return None


def run_mini_swe_agent(url: str, rollouts: int, threads: int, workdir: str) -> tuple[Usage, list[str], list[str]]:
    """mini-swe-agent's batch runner, minus its files and progress display (in a process of its own: see
    ``mini_swe_agent_process``)."""
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
        # a request timeout below litellm's 600 s default: a lost response costs a retry, not the run
        "model_kwargs": {"api_base": url, "api_key": "unused", "timeout": 60},
        "action_regex": r"```bash\s*\n(.*?)\n```",
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
        server_stats(url, reset=True)
        with Probe() as probe:
            bad = [b for b in pool.map(one, range(rollouts)) if b]
    return probe.usage, bad, [served(url)]


def mini_swe_agent_process(url: str, rollouts: int, threads: int) -> tuple[Usage, list[str], list[str]]:
    """``run_mini_swe_agent`` in a fresh process (``--mini-swe-agent-child``): none of the farm's state (Ray's
    threads, the driver's heap) in its way, and its own CPU and RSS, measured there."""
    argv = [sys.executable, __file__, "--mini-swe-agent-child", url, str(rollouts), str(threads)]
    with tempfile.TemporaryDirectory(prefix="mswea-config-") as config_dir:
        env = {**os.environ, **MINI_SWE_ENV, "MSWEA_GLOBAL_CONFIG_DIR": config_dir}
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"mini-swe-agent ({threads} threads) failed:\n{done.stderr[-3000:]}")
    out = json.loads(lines[-1])
    usage = out["usage"]
    usage["peak_rss_of"] = {tuple(k.split(",")): v for k, v in usage["peak_rss_of"].items()}
    return Usage(**usage), out["bad"], out["notes"]


def mini_swe_agent_child(url: str, rollouts: int, threads: int) -> int:
    raise_open_file_limit()
    tune_gc()  # as in the parent, so both systems run with the same collector settings
    with tempfile.TemporaryDirectory(prefix="mswea-work-") as workdir:
        usage, bad, notes = run_mini_swe_agent(url, rollouts, threads, workdir)
    data = dataclasses.asdict(usage)
    data["peak_rss_of"] = {",".join(k): v for k, v in usage.peak_rss_of.items()}
    print(json.dumps({"usage": data, "bad": bad, "notes": notes}))
    return 0


async def bare_spawns(n: int, concurrency: int) -> tuple[Usage, list[str]]:
    """The floor of (b): ``n`` bare ``bash -c 'echo step 1'`` processes from a plain asyncio loop, ``concurrency``
    at a time, each in its own session and read to its end (what the local runtime does per command, without
    the farm or the agent); failures are the spawns that did not print their line."""
    semaphore = asyncio.Semaphore(concurrency)
    bad: list[str] = []

    async def one() -> None:
        async with semaphore:
            proc = await asyncio.create_subprocess_exec("bash", "-c", "echo step 1", stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT, start_new_session=True)
            out, _ = await proc.communicate()
            if proc.returncode != 0 or out != b"step 1\n":
                bad.append(f"exit {proc.returncode}: {out[:200]!r}")

    await asyncio.gather(*(one() for _ in range(concurrency)))  # warm-up
    with Probe() as probe:
        await asyncio.gather(*(one() for _ in range(n)))
    return probe.usage, bad


def part_b(sizes: Sizes, all_workers: bool, profile: bool, deadline: float) -> list[Row]:
    """The first farm window and mini-swe-agent thread count always run; the others while ``deadline``
    (``time.monotonic``) allows, each system's next one estimated from its last."""
    n, latency = sizes.b_rollouts, sizes.b_latency
    runtime = {"type": "local", "allow_host_exec": True}  # the commands are the scripted policy's echo
    windows = list(sizes.b_windows)  # the likely best first
    threads_todo = sorted(sizes.b_threads, reverse=True)
    farm_rows: list[Row] = []
    mini_rows: list[Row] = []
    missing = mini_swe_agent_missing()
    if missing is not None:
        mini_rows.append(Row("b", "mini-swe-agent batch runner", "-", None, "not run", "", "", [missing]))
        threads_todo = []

    def fits(rows: list[Row], startup: float) -> bool:
        last = max((r.usage.wall for r in rows if r.usage is not None), default=0.0)
        return time.monotonic() + 1.2 * last + startup < deadline

    def skipped(system: str, setting: str, order: int) -> Row:
        return Row("b", system, setting, None, "skipped", "", "",
                   ["not run: the time budget (--budget) would be passed; its other settings ran"], order=order)

    before = load()
    spawns = STEPS * n
    usage, bad = asyncio.run(bare_spawns(spawns, 64))
    floor = Row("b", "bare bash -c spawns (floor)", f"{spawns} spawns, 64 at a time", usage,
                f"{spawns / usage.wall:.0f} spawns/s = {spawns / usage.wall / STEPS:.1f} rollouts/s at {STEPS} "
                "commands", "floor", "", [f"load {before}->{load()}"] + failed_note(bad),
                value=0.0 if bad else spawns / usage.wall / STEPS, order=-1)

    with server_process(latency) as (url, server_pid):

        def farm_window(window: int, workers: int) -> None:
            setting = f"{n} rollouts, window {window}, {workers} worker(s), L={latency:g}s"
            order = window * 10 + workers
            if farm_rows and not fits(farm_rows, 20.0):
                farm_rows.append(skipped("farm (ray), local runtime", setting, order))
                return
            before = load()
            ideal = -(-n // window) * STEPS * latency
            spy = Profiler(ideal / 2, 2 * ideal) if profile else None
            usage, bad, info = run_farm(url, server_pid, runtime, f"bench-b{window}-{workers}", n, window, latency, spy,
                                        workers_per_node=workers)
            row = Row("b", "farm (ray), local runtime", setting, usage, f"{n / usage.wall:.1f} rollouts/s", "", "",
                      info["timings"] + [f"load {before}->{load()}"], value=n / usage.wall,
                      rss_groups=(DRIVER, WORKERS), cpu_groups=(DRIVER, WORKERS, RAY), profile=info["profile"],
                      order=order)
            row.notes += failed_note(bad)
            farm_rows.append(row)

        def mini_threads(threads: int) -> None:
            setting = f"{n} rollouts, {threads} threads, L={latency:g}s"
            best = max((r.value for r in mini_rows), default=0.0)
            bound = threads / (STEPS * latency)
            if not all_workers and best > bound:
                mini_rows.append(Row("b", "mini-swe-agent batch runner", setting, None, "skipped", "", "", [
                    f"cannot be its best: Little's law caps {threads} threads at {bound:.1f} rollouts/s "
                    f"< {best:.1f} measured (--all-workers runs it)"], order=threads))
                return
            if mini_rows and not fits(mini_rows, 5.0):
                mini_rows.append(skipped("mini-swe-agent batch runner", setting, threads))
                return
            before = load()
            usage, bad, notes = mini_swe_agent_process(url, n, threads)
            row = Row("b", "mini-swe-agent batch runner", setting, usage, f"{n / usage.wall:.1f} rollouts/s",
                      "", "", notes + [f"load {before}->{load()}"], value=n / usage.wall, order=threads)
            row.notes += failed_note(bad)
            mini_rows.append(row)

        while windows or threads_todo:  # alternate, so a short budget still measures both systems
            if windows:
                farm_window(*windows.pop(0))
            if threads_todo:
                mini_threads(threads_todo.pop(0))

    measured_farm = [r for r in farm_rows if r.usage is not None]
    measured_mini = [r for r in mini_rows if r.usage is not None]
    best_farm = max(measured_farm, key=lambda r: r.value)
    best_farm.target = ">= 0.8x the floor, >= 2x mini-swe-agent"
    verdicts = []
    farm_failed = any(note.endswith("failed") or " failed, e.g. " in note for note in best_farm.notes)
    for name, base, need in [("floor", floor if floor.value else None, 0.8),
                             ("mini-swe-agent", max(measured_mini, key=lambda r: r.value) if measured_mini else None,
                              2.0)]:
        if base is None:
            best_farm.result += f" (no ratio to the {name}: it did not run or failed)" if name == "floor" else ""
            continue
        if name != "floor":
            base.target = "baseline (its best)"
        if farm_failed or any(" failed, e.g. " in note for note in base.notes):
            best_farm.result += f" (no ratio to {name}: a side failed rollouts)"
            verdicts.append(False)
            continue
        ratio = best_farm.value / base.value
        best_farm.result += f" ({ratio:.2f}x {name})"
        verdicts.append(ratio >= need)
    best_farm.verdict = ("pass" if all(verdicts) else "MISS") if verdicts else "n/a"
    for row in measured_farm:
        if row is not best_farm:
            row.target = "(not the best setting)"
    return [floor] + sorted(farm_rows, key=lambda r: r.order) + sorted(mini_rows, key=lambda r: r.order)


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
        notes.append(f"scripted server cpu {sum(u.extra_cpu.values()):.1f} s, "
                     f"peak {u.peak_cores.get('watched', 0.0):.2f} cores")
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--mini-swe-agent-child"]:  # internal: one mini-swe-agent measurement (url, rollouts, threads)
        return mini_swe_agent_child(argv[1], int(argv[2]), int(argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small versions of every part (a smoke test)")
    parser.add_argument("--only", choices=["a", "b", "c"], nargs="+", help="run only these parts")
    parser.add_argument("--no-profile", action="store_true", help="do not sample the farm's processes with py-spy")
    parser.add_argument("--ray-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set before Ray starts, so its processes inherit it (A/B runs, e.g. RAY_USE_UVLOOP=0)")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole run: (b)'s further windows and thread counts are skipped past it")
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
    by_part: dict[str, list[Row]] = {}
    profile = not args.no_profile
    t0, load0 = time.perf_counter(), load()
    deadline = time.monotonic() + args.budget
    if "a" in parts:
        by_part["a"] = part_a(sizes, profile)
    if "c" in parts:  # before (b), whose optional settings then use what is left of the budget
        by_part["c"] = part_c(sizes, profile)
    if "b" in parts:
        by_part["b"] = part_b(sizes, args.all_workers, profile, deadline)
    rows = [row for part in ("a", "b", "c") for row in by_part.get(part, [])]
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
