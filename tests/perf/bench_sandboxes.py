"""Container lifecycles at N at once: rollouts through the farm vs raw ``docker run --rm`` at the same parallelism.

    python tests/perf/bench_sandboxes.py [--sizes 16 64 128 256] [--quick] [--latency 1.0] [--no-sdk]
                                         [--extra start_limit=4 start_limit=16] [--extra-at 128] [--profile]

For each N (``--sizes``; ``--quick``: 16 and 64), in the same run, the sides one after the other, their order
rotating from one N to the next (none always runs on a daemon another just worked):

- **farm**: N rollouts of one task each, all at once (``run.concurrency=N``), through ``RolloutFarm.generate``: the
  docker runtime on the base image with its defaults (limits, dead-man's switch, ``runtime.start_limit`` /
  ``start_rate`` / ``start_retries``), the mini-SWE agent, the ``seed_writer`` policy played in process with
  ``--latency`` seconds per model call (``serve: {app: scripted, in_process: true}``): reset (the container start),
  a model call, ``echo <seed> > seed.txt``, a model call, the submit command, then the ``check_command`` verifier's
  ``test -s seed.txt``, and the container's removal. A rollout counts as done when it completed with reward 1.
  Each farm gets a warm-up call of 2 rollouts first (untimed: imports, the docker client, the owner watchdog).
- **raw**: N ``docker run --rm`` of the docker CLI at once (asyncio subprocesses), with the runtime's limits
  (memory, CPUs, pids, capabilities, ``--init``, no network, the file-size ulimit) and a label of the bench's own,
  running the same commands under ``bash -lc`` with the model's wait as a ``sleep`` before each of the first two.
  A lifecycle counts as done when ``docker run`` exited 0 and the check passed.
- **sdk** (unless ``--no-sdk``): the engine API calls the runtime makes, from N plain threads with the docker SDK:
  create and start (same limits, ``sleep`` as the main process), after each model wait (a ``sleep`` here) an exec of
  ``bash -lc <command>``, the check's exec, then a forced removal. The farm's mechanism without the farm: the farm
  against it is what the farm's own code costs; it against raw is what running each command as an exec costs.

Backend: ``farm.backend=local``. Its rollouts run in this process with the same ``DockerRuntime``, I/O pool and start
queue (``envs.runtimes.docker.start_gate``) that a Ray node's worker process runs them with (a 2-CPU node has one
worker process, so one queue), so the queue's counters (``start_gate.stats()``) are read here, as deltas over the
measured call; what Ray adds per rollout (dispatch, the results' trip to the driver) is ``bench_farm.py``'s
measurement, not this one's. ``farm.cpus_per_rollout`` therefore does not apply: the local backend runs
``run.concurrency`` rollouts at once whatever a rollout reserves.

Per row: wall seconds of the N (the measured call; the first launch to the last exit), rollouts or lifecycles a
second (N / wall) and the ratio to raw's (target for the farm >= 0.8x), container start p50/p99 (farm: each
result's ``timings.reset``, its wait in the start queue included, ending when the engine's start call returned;
raw: from launching ``docker run`` to the container's first command printing its clock; sdk: create + start),
engine errors (farm: the start queue's ``engine_errors``, each retried; raw: non-zero ``docker run`` exits; sdk:
failed lifecycles), infrastructure failures (farm: infra-failed attempts / rollouts that ended infra-failed; raw,
sdk: failed lifecycles, which nothing retries), containers left (farm: by the call's ``rollout-farm.run`` label
once ``generate`` returned; raw, sdk: by the bench's label once the last lifecycle ended), dockerd's peak RSS
(``VmRSS``, sampled every 0.5 s during the side) and its growth over the side (the daemon keeps what it grew, so a
later side starts higher), and the machine's busy CPU-seconds meanwhile (``/proc/stat``: every process, the
kernel's work for them included), in all and per lifecycle. When a side keeps every core busy, its lifecycles/s is
the cores over its CPU-seconds per lifecycle, and the line under the table says so for a missed target. Targets:
farm >= 0.8x raw at every N, 0 infra failures and 0 left at 256; start p99 printed. The notes split each farm
row's time (start queue wait, engine start, agent, model calls, commands, verify, removal) beside the start
queue's pacing floor ((N - 1) / start_rate), and give the raw and sdk sides' parts.

``--extra`` adds farm rows at ``--extra-at`` (default 128) with other runtime keys (``start_limit=4``,
``start_rate=none``), measured right after that N's sides. ``--profile``: py-spy (``pip install py-spy``) on this
process during the farm side at the largest N, summarised under the table (the I/O pool's threads blocked on the
engine's sockets show there as busy: read it beside this process's CPU-seconds in the notes). Everything the bench
started (containers by its labels) is removed at the end, also on an error or Ctrl-C. Each farm call has a
deadline (900 s) and each ``docker run`` a timeout (900 s), so a daemon that stops answering ends the bench with
sides that did not do their work instead of a hang.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PERF = Path(__file__).resolve().parent
sys.path.insert(0, str(PERF.parents[1]))
sys.path.insert(0, str(PERF))

from _farm_bench_util import start_py_spy, summarize_profile  # noqa: E402
from _sides import Side, one_line, ratio  # noqa: E402

from envs.images.image_names import DEFAULT_BASE_IMAGE  # noqa: E402
from envs.runtimes.docker import start_gate  # noqa: E402
from envs.runtimes.docker.config import DockerRuntimeConfig  # noqa: E402
from envs.runtimes.docker.containers import RUN_LABEL  # noqa: E402
from envs.runtimes.docker.start import size_bytes, ulimit as docker_ulimit  # noqa: E402
from rollout.errors import SUBMIT_SENTINEL  # noqa: E402

TARGET = 0.8
RAW_LABEL = "rollout-farm-bench.sandboxes"
"""The raw side's containers carry ``<RAW_LABEL>=<the bench's tag>``."""
TICK = os.sysconf("SC_CLK_TCK")
SEED = 7
QUIET = open(os.devnull, "w")  # the farms' own lines (the scripted server's address, the disk-limit note)


# ---- the docker daemon, sampled --------------------------------------------------------------------------------


def pids_named(*names: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in names or any(comm.startswith(n) for n in names if n.endswith("*")):
                found.append(int(entry))
    return found


def vm_rss(pid: int) -> int:
    """Bytes (``VmRSS`` of ``/proc/<pid>/status``), 0 when gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (its threads included), 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def busy_cpu() -> float:
    """CPU-seconds the machine has been busy since boot (every process), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:7]) - ticks[3] - ticks[4]) / TICK


@dataclass
class Daemon:
    """What the daemons did during one side: dockerd's RSS (start, peak), containerd and its shims' summed peak RSS,
    CPU-seconds of dockerd, containerd and the whole machine, and this process's children's (the CLI)."""

    rss_start: int = 0
    rss_peak: int = 0
    containerd_peak: int = 0
    dockerd_cpu: float = 0.0
    containerd_cpu: float = 0.0
    busy: float = 0.0
    children_cpu: float = 0.0
    self_cpu: float = 0.0


class DaemonProbe:
    """``with DaemonProbe() as probe``: samples dockerd's VmRSS (and containerd's + its shims') every 0.5 s."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.result = Daemon()
        self._stop = threading.Event()
        dockerd = pids_named("dockerd")
        if not dockerd:
            raise SystemExit("no dockerd process found in /proc: the bench reads its memory there")
        self.dockerd = dockerd[0]
        self.containerd = pids_named("containerd")

    def _sample(self) -> None:
        self.result.rss_peak = max(self.result.rss_peak, vm_rss(self.dockerd))
        shims = sum(vm_rss(p) for p in self.containerd + pids_named("containerd-shim*"))
        self.result.containerd_peak = max(self.result.containerd_peak, shims)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "DaemonProbe":
        self.result.rss_start = vm_rss(self.dockerd)
        self._sample()
        self._cpu0 = (cpu_seconds(self.dockerd), sum(cpu_seconds(p) for p in self.containerd), busy_cpu(),
                      resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF))
        self._thread = threading.Thread(target=self._loop, name="bench-dockerd-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        dockerd0, containerd0, busy0, children0, self0 = self._cpu0
        children, own = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        self.result.dockerd_cpu = cpu_seconds(self.dockerd) - dockerd0
        self.result.containerd_cpu = sum(cpu_seconds(p) for p in self.containerd) - containerd0
        self.result.busy = busy_cpu() - busy0
        self.result.children_cpu = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
        self.result.self_cpu = (own.ru_utime + own.ru_stime) - (self0.ru_utime + self0.ru_stime)


# ---- containers by label ---------------------------------------------------------------------------------------


def containers_with(label: str, value_prefix: str) -> list[str]:
    """Ids of the containers (running or not) whose ``label`` starts with ``value_prefix``."""
    out = subprocess.run(["docker", "ps", "-a", "--filter", f"label={label}", "--format",
                          f'{{{{.ID}}}} {{{{.Label "{label}"}}}}'], capture_output=True, text=True, timeout=120).stdout
    return [cid for cid, _, value in (line.partition(" ") for line in out.splitlines())
            if value == value_prefix or value.startswith(value_prefix)]


def remove_all(tag: str) -> int:
    """Remove every container of this bench (farm calls' and raw lifecycles'): the number removed."""
    ids = containers_with(RUN_LABEL, f"{tag}-") + containers_with(RAW_LABEL, tag)
    if ids:
        try:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=300)
        except subprocess.TimeoutExpired:  # a daemon that stopped answering: say so rather than hang
            print(f"docker rm -f of {len(ids)} container(s) did not return in 300 s; the daemon may be stuck (its "
                  "goroutine dump: kill -USR1 <dockerd pid>)", file=sys.stderr)
    return len(ids)


def settle(tag: str, seconds: float = 20.0) -> None:
    """Between sides: wait until none of the bench's containers is left (the daemon finishing removals), at most
    ``seconds``."""
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and (containers_with(RUN_LABEL, f"{tag}-") or containers_with(RAW_LABEL, tag)):
            time.sleep(0.5)
    except subprocess.TimeoutExpired:
        print("the daemon did not list containers in 120 s", file=sys.stderr)
    time.sleep(1.0)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- the sides -------------------------------------------------------------------------------------------------


@dataclass
class Row:
    side: str
    n: int
    wall: float
    starts: list[float]
    side_record: Side
    engine_errors: int
    infra_attempts: int
    infra_final: int
    left: int
    daemon: Daemon
    label: str = ""
    notes: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.side_record.done / self.wall if self.wall else 0.0


def farm_config(run_id: str, n: int, latency: float, image: str, runtime: dict) -> dict:
    return {
        "run_id": run_id,
        "model": {"type": "openai", "model": "scripted"},
        "serve": {"app": "scripted", "in_process": True, "policy": "seed_writer", "latency": latency},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell", "command_timeout": 60},
        "runtime": {"type": "docker", "image": image, **runtime},
        "verifier": {"type": "check_command"},
        "farm": {"backend": "local"},
        "run": {"concurrency": n, "max_attempts": 3},
    }


def tasks(prefix: str, n: int) -> list[dict]:
    return [{"task_id": f"{prefix}{i}", "prompt": "Write your seed.", "data": {"check": "test -s seed.txt"}}
            for i in range(n)]


def farm_side(tag: str, n: int, latency: float, image: str, runtime: dict, label: str, profile: bool,
              out: Path, deadline: float = 900.0) -> Row:
    from cluster.farm.rollout_farm import RolloutFarm

    name = f"{tag}-{label.replace('=', '').replace(',', '-')}-{n}"
    farm = RolloutFarm.from_config(farm_config(name, n, latency, image, runtime), out=QUIET)
    spy = None
    try:
        farm.start()
        farm.generate(tasks("warm", 2), deadline=deadline)  # call 0, untimed
        gate = start_gate.stats()
        before = (gate.starts, gate.engine_errors, gate.gave_up, len(gate.waited))
        gate.in_flight_peak = 0
        rows = tasks("t", n)
        with DaemonProbe() as probe:
            if profile:
                spy = start_py_spy(os.getpid(), 600, str(out / f"farm-{n}.txt"))
            t0 = time.perf_counter()
            batch = farm.generate(rows, deadline=deadline)  # call 1
            wall = time.perf_counter() - t0
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
            spy.wait(timeout=60)
        left = len(containers_with(RUN_LABEL, f"{name}-1"))
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        farm.close()
    left_after_close = len(containers_with(RUN_LABEL, f"{name}-1"))
    results = [r for g in [*batch.groups, *batch.dropped] for r in g.results]
    done = [r for r in results if r.status == "completed" and r.reward == 1.0]
    bad = next((r for r in results if not (r.status == "completed" and r.reward == 1.0)), None)
    error = ""
    if bad is not None:
        error = f"{bad.task_id}: {bad.status} {bad.exit_reason} {bad.error.message if bad.error else ''}".strip()
    elif len(results) != n:
        error = f"{len(results)} results for {n} rollouts ({len(batch.not_started)} not started)"
    waited = gate.waited[before[3]:]
    starts_made = gate.starts - before[0]
    resets = [r.timings["reset"] for r in results if "reset" in r.timings]
    row = Row("farm", n, wall, resets, Side("farm", n, len(done), one_line(error)),
              engine_errors=gate.engine_errors - before[1],
              infra_attempts=sum(r.attempt - (r.status == "completed") for r in results),
              infra_final=sum(r.status == "infra_failed" for r in results), left=left, daemon=probe.result,
              label=label)
    timings = {k: [r.timings[k] for r in done if k in r.timings] for k in ("agent", "verify", "total")}
    close = [r.timings["total"] - r.timings["agent"] - r.timings.get("verify", 0.0) for r in done
             if "total" in r.timings and "agent" in r.timings]
    model_calls = [sum(s.model_seconds for s in r.trajectory.steps) for r in done]
    commands = [sum(s.env_seconds for s in r.trajectory.steps) for r in done]
    engine_start = (sum(resets) - sum(waited)) / starts_made if starts_made else float("nan")
    rate = runtime.get("start_rate", DockerRuntimeConfig().start_rate)
    limit = runtime.get("start_limit", DockerRuntimeConfig().start_limit)
    floor = (n - 1) / rate if rate else 0.0
    row.notes.append(
        f"farm {label or 'defaults'} N={n}: start queue wait p50/p99 {pct(waited, .5):.2f}/{pct(waited, .99):.2f}s, "
        f"engine start mean {engine_start:.2f}s ({starts_made} starts, {limit} in flight at most, peak "
        f"{gate.in_flight_peak}, {gate.gave_up - before[2]} gave up); agent incl. reset p50/p99 "
        f"{pct(timings['agent'], .5):.2f}/{pct(timings['agent'], .99):.2f}s (model calls p50 "
        f"{pct(model_calls, .5):.2f}s, commands p50/p99 {pct(commands, .5):.2f}/{pct(commands, .99):.2f}s), "
        f"verify p50 {pct(timings['verify'], .5):.2f}s, removal p50/p99 "
        f"{pct(close, .5):.2f}/{pct(close, .99):.2f}s, total p50/max {pct(timings['total'], .5):.2f}/"
        f"{max(timings['total'], default=float('nan')):.2f}s; the queue's pacing alone: (N-1)/start_rate = "
        f"{floor:.1f}s; this process {probe.result.self_cpu:.1f} CPU-s"
        + (f"; {left_after_close} still there after close()" if left else ""))
    if profile and spy is not None:
        row.profile = summarize_profile(str(out / f"farm-{n}.txt"))
    return row


def raw_argv(tag: str, image: str, latency: float) -> list[str]:
    """``docker run --rm`` with the runtime's default limits, the same commands and the model's wait as sleeps."""
    cfg = DockerRuntimeConfig(image=image)
    caps = [arg for cap in cfg.cap_add for arg in ("--cap-add", cap)]
    security = [arg for opt in cfg.security_opt for arg in ("--security-opt", opt)]
    shell = " ".join(cfg.shell)
    script = (f"date +%s.%N; sleep {latency:g}; {shell} 'echo {SEED} > seed.txt'; sleep {latency:g}; "
              f"{shell} 'echo {SUBMIT_SENTINEL}'; {shell} 'test -s seed.txt' && echo check-ok; date +%s.%N")
    return ["docker", "run", "--rm", "--label", f"{RAW_LABEL}={tag}", "--network", cfg.network, "--memory", cfg.memory,
            "--memory-swap", cfg.memory, "--cpus", f"{cfg.cpus:g}", "--pids-limit", str(cfg.pids_limit),
            "--cap-drop", "ALL", *caps, *security, "--init", "--ulimit",
            f"fsize={size_bytes(cfg.max_file_size)}", "-w", cfg.workdir, image, "sh", "-c", script]


async def raw_lifecycles(argv: list[str], n: int) -> list[dict]:
    async def one() -> dict:
        launched = time.time()
        t0 = time.perf_counter()
        proc = None
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=900)
        except Exception as exc:  # noqa: BLE001 - a lifecycle that failed is data
            if proc is not None and proc.returncode is None:
                proc.kill()  # its container, if any, goes with the bench's label at the end
            return {"code": -1, "wall": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"}
        wall = time.perf_counter() - t0
        lines = stdout.decode(errors="replace").split()
        found = {"code": proc.returncode, "wall": wall, "ok": "check-ok" in lines,
                 "error": one_line(stderr.decode(errors="replace") or stdout.decode(errors="replace"))}
        try:
            first, last = float(lines[0]), float(lines[-1])
        except (IndexError, ValueError):
            return found
        return {**found, "start": first - launched, "inside": last - first, "after": launched + wall - last}

    return await asyncio.gather(*(one() for _ in range(n)))


def raw_side(tag: str, n: int, latency: float, image: str) -> Row:
    argv = raw_argv(tag, image, latency)
    with DaemonProbe() as probe:
        t0 = time.perf_counter()
        got = asyncio.run(raw_lifecycles(argv, n))
        wall = time.perf_counter() - t0
    left = len(containers_with(RAW_LABEL, tag))
    done = [g for g in got if g["code"] == 0 and g.get("ok")]
    bad = next((g for g in got if not (g["code"] == 0 and g.get("ok"))), None)
    error = f"docker run exit {bad['code']}: {bad['error']}" if bad else ""
    starts = [g["start"] for g in got if "start" in g]
    failed = sum(g["code"] != 0 for g in got)
    row = Row("raw", n, wall, starts, Side("raw", n, len(done), error), engine_errors=failed, infra_attempts=failed,
              infra_final=failed, left=left, daemon=probe.result)
    inside = [g["inside"] for g in done if "inside" in g]
    after = [g["after"] for g in done if "after" in g]
    row.notes.append(f"raw N={n}: in the container p50 {pct(inside, .5):.2f}s, its last command to the CLI's exit "
                     f"(exit, removal, the CLI) p50/p99 {pct(after, .5):.2f}/{pct(after, .99):.2f}s, lifecycle p50/max "
                     f"{pct([g['wall'] for g in got], .5):.2f}/{max(g['wall'] for g in got):.2f}s; the docker CLI "
                     f"processes {probe.result.children_cpu:.1f} CPU-s")
    return row


def sdk_lifecycle(api, tag: str, image: str, latency: float) -> dict:
    """One container through the engine API the runtime uses (create, start, an exec per command, remove), from a
    plain thread: the farm's mechanism without the farm."""
    cfg = DockerRuntimeConfig(image=image)
    found: dict = {"ok": False, "error": ""}
    cid = None
    t0 = time.perf_counter()
    try:
        host = api.create_host_config(
            network_mode=cfg.network, mem_limit=cfg.memory, memswap_limit=cfg.memory, nano_cpus=int(cfg.cpus * 1e9),
            pids_limit=cfg.pids_limit, cap_drop=["ALL"], cap_add=cfg.cap_add, security_opt=cfg.security_opt,
            init=True, auto_remove=True, ulimits=[docker_ulimit("fsize", size_bytes(cfg.max_file_size))])
        cid = api.create_container(image, ["sleep", str(int(cfg.ttl))], labels={RAW_LABEL: tag},
                                   working_dir=cfg.workdir, host_config=host)["Id"]
        api.start(cid)
        found["start"] = time.perf_counter() - t0
        outputs = []
        steps = [(latency, f"echo {SEED} > seed.txt"), (latency, f"echo {SUBMIT_SENTINEL}"),
                 (0.0, "test -s seed.txt && echo check-ok")]  # a model call before each command; then the check
        for wait, command in steps:
            time.sleep(wait)
            run = api.exec_create(cid, [*cfg.shell, command], workdir=cfg.workdir)
            outputs.append(api.exec_start(run["Id"]).decode(errors="replace"))
        found["ok"] = "check-ok" in outputs[-1]
        found["error"] = "" if found["ok"] else f"check: {one_line(outputs[-1])}"
    except Exception as exc:  # noqa: BLE001 - a lifecycle that failed is data
        found["error"] = f"{type(exc).__name__}: {one_line(str(exc))}"
    finally:
        if cid is not None:
            t1 = time.perf_counter()
            try:
                api.remove_container(cid, force=True)
            except Exception as exc:  # noqa: BLE001 - auto-remove may have been first
                if "404" not in str(exc) and "409" not in str(exc) and not found["error"]:
                    found["error"] = f"remove: {one_line(str(exc))}"
            found["remove"] = time.perf_counter() - t1
    found["wall"] = time.perf_counter() - t0
    return found


def sdk_side(tag: str, n: int, latency: float, image: str) -> Row:
    from concurrent.futures import ThreadPoolExecutor

    import docker

    api = docker.from_env(max_pool_size=max(10, n)).api
    with DaemonProbe() as probe, ThreadPoolExecutor(max_workers=n, thread_name_prefix="bench-sdk") as pool:
        t0 = time.perf_counter()
        got = list(pool.map(lambda _: sdk_lifecycle(api, tag, image, latency), range(n)))
        wall = time.perf_counter() - t0
    left = len(containers_with(RAW_LABEL, tag))
    done = [g for g in got if g["ok"] and not g["error"]]
    bad = next((g for g in got if not (g["ok"] and not g["error"])), None)
    failed = n - len(done)
    row = Row("sdk", n, wall, [g["start"] for g in got if "start" in g],
              Side("sdk", n, len(done), bad["error"] if bad else ""), engine_errors=failed, infra_attempts=failed,
              infra_final=failed, left=left, daemon=probe.result)
    removal = [g["remove"] for g in got if "remove" in g]
    row.notes.append(f"sdk N={n}: create+start p50/p99 {pct(row.starts, .5):.2f}/{pct(row.starts, .99):.2f}s, removal "
                     f"p50/p99 {pct(removal, .5):.2f}/{pct(removal, .99):.2f}s, lifecycle p50/max "
                     f"{pct([g['wall'] for g in got], .5):.2f}/{max(g['wall'] for g in got):.2f}s; this process "
                     f"{probe.result.self_cpu:.1f} CPU-s")
    return row


# ---- the table -------------------------------------------------------------------------------------------------


def report(rows: list[Row], args: argparse.Namespace) -> None:
    mb = 1 << 20
    image = args.image or DEFAULT_BASE_IMAGE
    print(f"\nsandbox lifecycles at N at once: farm (local backend, {image}, seed_writer, {args.latency:g}s a model "
          f"call x 2) vs raw `docker run --rm` (same commands, sleeps for the model) and sdk (the engine API calls the "
          f"runtime makes, from threads); {os.cpu_count()} cores; x raw: rate over raw's rate")
    print(f"{'side':<22} {'N':>4} {'wall s':>7} {'per s':>6} {'x raw':>6} {'start p50':>9} {'p99 s':>6} "
          f"{'eng err':>7} {'infra':>6} {'left':>4} {'dockerd MB':>10} {'(+grew)':>8} {'CPU-s':>6} {'each':>5}")
    raw_by_n = {r.n: r for r in rows if r.side == "raw"}
    order = {"farm": 0, "raw": 1, "sdk": 2}
    rows = sorted(rows, key=lambda r: (r.n, bool(r.label), order[r.side]))
    for r in rows:
        name = r.side + (f" {r.label}" if r.label else "")
        base = raw_by_n.get(r.n)
        shown = "" if r.side == "raw" or base is None else ratio(r.rate, base.rate, r.side_record, base.side_record)
        infra = f"{r.infra_attempts}/{r.infra_final}" if r.side == "farm" else f"{r.infra_final}"
        cells = (f"{name:<22} {r.n:>4} {r.wall:>7.1f} {r.rate:>6.1f} {shown if len(shown) <= 6 else '-':>6} "
                 f"{pct(r.starts, .5):>9.2f} {pct(r.starts, .99):>6.2f} {r.engine_errors:>7} {infra:>6} {r.left:>4} "
                 f"{r.daemon.rss_peak / mb:>10.0f} {(r.daemon.rss_peak - r.daemon.rss_start) / mb:>+8.0f} "
                 f"{r.daemon.busy:>6.1f} {r.daemon.busy / r.n:>5.2f}")
        print(cells)
        if len(shown) > 6:
            print(f"{'':<22} {shown}")
    print(f"targets: farm/raw >= {TARGET}x at every N; at 256: 0 infra failures and 0 containers left. infra: farm "
          "infra-failed attempts/rollouts that ended infra-failed, raw failed lifecycles (none retried)")
    for r in rows:
        if r.side == "farm" and not r.label and r.n in raw_by_n:
            base = raw_by_n[r.n]
            if r.side_record.ok and base.side_record.ok:
                met = r.rate / base.rate >= TARGET
                why = [] if met else [f"{r.rate / base.rate:.2f}x < {TARGET}x"]
            else:
                why = [s.failure() for s in (r.side_record, base.side_record) if not s.ok]
            if r.n >= 256 and (r.infra_final or r.infra_attempts or r.left):
                why.append(f"{r.infra_attempts} infra-failed attempts, {r.left} left")
            print(f"N={r.n}: {'met' if not why else 'NOT met: ' + '; '.join(why)}")
            cores = os.cpu_count() or 1
            busy = [x.daemon.busy / x.wall / cores for x in (r, base) if x.wall]
            if why and r.side_record.ok and base.side_record.ok and busy and min(busy) >= 0.9:
                sdk = next((x for x in rows if x.side == "sdk" and x.n == r.n), None)
                also = (f"; sdk, the same engine calls without the farm, {sdk.daemon.busy / sdk.n:.2f} "
                        f"({(base.daemon.busy / base.n) / (sdk.daemon.busy / sdk.n):.2f}x)") if sdk else ""
                print(f"  both sides kept the {cores} cores busy ({100 * busy[0]:.0f} % and {100 * busy[1]:.0f} %): "
                      f"lifecycles/s follow CPU-s per lifecycle, raw {base.daemon.busy / base.n:.2f} / farm "
                      f"{r.daemon.busy / r.n:.2f} = {(base.daemon.busy / base.n) / (r.daemon.busy / r.n):.2f}x{also}")
    print("notes:")
    for r in rows:
        d = r.daemon
        for note in r.notes:
            print(f"  {note}; dockerd {d.dockerd_cpu:.1f} CPU-s, containerd {d.containerd_cpu:.1f} CPU-s, containerd + "
                  f"its shims peak RSS {d.containerd_peak / mb:.0f} MB")
    for r in rows:
        if r.profile:
            print(f"py-spy of this process during the farm side at N={r.n}:")
            for line in r.profile:
                print(f"  {line}")


def attempt(side: str, n: int, label: str, measure) -> Row:
    """``measure()``, or a row that did none of its work and says why (the daemon stopped answering, ...)."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - one side's failure is a row of the table, the others still run
        print(f"N={n}: {side} {label} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return Row(side, n, float("nan"), [], Side(side, n, 0, f"{type(exc).__name__}: {one_line(str(exc))}"),
                   engine_errors=0, infra_attempts=0, infra_final=0, left=0, daemon=Daemon(), label=label)


def parse_extra(spec: str) -> dict:
    """``start_limit=4,start_rate=none`` → runtime keys."""
    out: dict = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        if key not in ("start_limit", "start_rate", "start_retries"):
            raise SystemExit(f"--extra: start_limit, start_rate or start_retries, not {key!r}")
        out[key] = None if value.lower() in ("none", "null") else (float(value) if key == "start_rate" else int(value))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 128, 256])
    parser.add_argument("--quick", action="store_true", help="N = 16 and 64")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per model call (2 calls a rollout)")
    parser.add_argument("--image", default=None, help=f"default {DEFAULT_BASE_IMAGE}")
    parser.add_argument("--extra", nargs="*", default=["start_limit=4", "start_limit=16"],
                        help="farm rows with other runtime keys at --extra-at (e.g. start_limit=4 start_rate=none)")
    parser.add_argument("--extra-at", type=int, default=128)
    parser.add_argument("--no-sdk", action="store_true", help="no side of plain engine API calls from threads")
    parser.add_argument("--profile", action="store_true", help="py-spy this process during the largest farm side")
    args = parser.parse_args(argv)
    sizes = [16, 64] if args.quick else args.sizes
    image = args.image or DEFAULT_BASE_IMAGE
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=120).returncode != 0:
        raise SystemExit(f"no image {image} on this docker (rollout images base builds it)")
    extras = [(spec, parse_extra(spec)) for spec in args.extra] if args.extra_at in sizes else []
    tag = f"bench-sbx-{secrets.token_hex(3)}"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still removes its containers
    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sandboxes-") as tmp:
            for index, n in enumerate(sizes):
                profile = args.profile and n == max(sizes)
                sides = [("farm", lambda: farm_side(tag, n, args.latency, image, {}, "", profile, Path(tmp))),
                         ("raw", lambda: raw_side(tag, n, args.latency, image)),
                         ("sdk", lambda: sdk_side(tag, n, args.latency, image))][:2 if args.no_sdk else 3]
                for name, side in sides[index % len(sides):] + sides[:index % len(sides)]:  # a new order each N
                    print(f"N={n}: {name} ...", file=sys.stderr, flush=True)
                    rows.append(attempt(name, n, "", side))
                    settle(tag)
                if n == args.extra_at:
                    for spec, runtime in extras:
                        print(f"N={n}: farm {spec} ...", file=sys.stderr, flush=True)
                        rows.append(attempt("farm", n, spec, lambda: farm_side(
                            tag, n, args.latency, image, runtime, spec, False, Path(tmp))))
                        settle(tag)
    finally:
        try:
            removed = remove_all(tag)
        except subprocess.TimeoutExpired:
            print(f"the daemon did not list containers in 120 s: remove the bench's by hand (labels "
                  f"{RUN_LABEL}={tag}-..., {RAW_LABEL}={tag})", file=sys.stderr)
        else:
            if removed:
                print(f"removed {removed} container(s) the bench left", file=sys.stderr)
    report(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
