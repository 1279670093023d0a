"""Measuring helpers for bench_farm.py: the scripted server in its own process, CPU and memory of a process
tree read from /proc (Linux), and a py-spy profile summarised as text.

CPU accounting: a process's CPU is ``utime + stime + cutime + cstime`` from ``/proc/<pid>/stat`` (its own
time plus that of the children it has reaped). A measurement is the sum, over the processes alive at its end,
of that figure's growth since the start (or since birth); a process that ends during the window is counted
through its parent's ``cutime`` (the parent reaps it: a shell command of a runtime, an exiting Ray worker),
less what it had used before the window. So short-lived subprocesses count, and nothing counts twice.
Memory is RSS (shared pages included), sampled every ``interval`` seconds and summed per group.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
DRIVER, WORKERS, RAY = "driver", "workers", "ray daemons"
"""Groups: this process (and its non-Ray children), Ray worker processes (``ray::<actor>`` or ``ray::IDLE``),
and the rest of Ray (gcs_server, raylet, agents, monitors)."""
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


@dataclass
class _Proc:
    ppid: int
    cpu: float
    """utime + stime + cutime + cstime, seconds."""
    rss: int
    """bytes"""


def _read_stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    # fields[0] is state (stat field 3): ppid 4, utime 14, stime 15, cutime 16, cstime 17, rss 24
    ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return _Proc(int(fields[1]), ticks / TICK, int(fields[21]) * PAGE)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _tree(root: int, exclude: set[int], names: dict[int, str]) -> dict[int, tuple[_Proc, str]]:
    """``root`` and its descendants with their groups, without the subtrees of ``exclude``."""
    procs: dict[int, _Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = _read_stat(int(name))
            if p is not None:
                procs[int(name)] = p
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, p in procs.items():
        children[p.ppid].append(pid)
    out: dict[int, tuple[_Proc, str]] = {}
    todo = [(root, DRIVER)]
    while todo:
        pid, parent_group = todo.pop()
        if pid in exclude or pid not in procs:
            continue
        group = DRIVER if pid == root else _group(pid, parent_group, names)
        out[pid] = (procs[pid], group)
        todo.extend((child, group) for child in children[pid])
    return out


def _group(pid: int, parent_group: str, names: dict[int, str]) -> str:
    """Ray processes by their command line; anything else (a shell command) belongs with its parent."""
    if pid not in names:
        names[pid] = _cmdline(pid)
    cmd = names[pid]
    if cmd.startswith("ray::"):
        return RAY if cmd.startswith(RAY_AGENTS) else WORKERS
    if "/ray/" in cmd:  # gcs_server, raylet, dashboard, log monitor, autoscaler monitor
        return RAY
    return parent_group


@dataclass
class Usage:
    wall: float
    cpu: dict[str, float]
    """CPU seconds per group."""
    peak_rss: dict[str, int]
    """Peak of each group's summed RSS, bytes."""
    peak_rss_of: dict[tuple[str, ...], int] = field(default_factory=dict)
    """Peak of the summed RSS of a set of groups (sampled together)."""
    extra_cpu: dict[int, float] = field(default_factory=dict)
    """CPU seconds of each watched pid outside the tree (the scripted server)."""
    peak_cores: dict[str, float] = field(default_factory=dict)
    """Each group's (and ``"watched"``'s) busiest second, in cores: 1.0 is one core flat out. A single-threaded
    process near 1.0 was the limit for that second."""
    samples: int = 0

    def cpu_of(self, *groups: str) -> float:
        return sum(self.cpu.get(g, 0.0) for g in groups)


class Probe:
    """Wall, CPU and peak RSS of this process tree while a block runs (``with Probe(...) as probe``; then
    ``probe.usage``). ``exclude`` pids (and their subtrees) are not part of the system measured; ``watch``
    pids get their own CPU figure (e.g. the scripted server, to show whether it was the limit)."""

    RSS_SETS = ((DRIVER,), (DRIVER, WORKERS), (DRIVER, WORKERS, RAY))

    def __init__(self, exclude: set[int] = frozenset(), watch: set[int] = frozenset(), interval: float = 0.5):
        self.root = os.getpid()
        self.exclude, self.watch, self.interval = set(exclude), set(watch), interval
        self.names: dict[int, str] = {}
        self.usage: Usage | None = None
        self._stop = threading.Event()
        self._peaks: dict = collections.defaultdict(int)
        self._samples = 0
        self._start: dict[int, tuple[_Proc, str]] = {}
        self._watch0: dict[int, float] = {}
        self._last: dict[int, tuple[float, str]] = {}
        self._acc: dict[str, float] = collections.defaultdict(float)
        self._series: list[tuple[float, dict[str, float]]] = []

    def _sample(self) -> dict[int, tuple[_Proc, str]]:
        now = time.perf_counter()
        tree = _tree(self.root, self.exclude, self.names)
        per: dict[str, int] = collections.defaultdict(int)
        # The rate series, with the same accounting as the totals: a process born since the last sample counts
        # whole; one that ended is taken back out whole, since its parent's cutime now holds its whole life.
        seen: dict[int, tuple[float, str]] = {}
        for pid, (p, group) in tree.items():
            per[group] += p.rss
            if pid in self._last:
                self._acc[group] += p.cpu - self._last[pid][0]
            elif self._series:
                self._acc[group] += p.cpu
            seen[pid] = (p.cpu, group)
        for pid, (cpu, group) in self._last.items():
            if pid not in seen and pid not in self.watch:
                self._acc[group] -= cpu
        for pid in self.watch:
            if (p := _read_stat(pid)) is not None:
                self._acc["watched"] += p.cpu - self._last.get(pid, (p.cpu, ""))[0]
                seen[pid] = (p.cpu, "watched")
        self._last = seen
        self._series.append((now, dict(self._acc)))
        for g, rss in per.items():
            self._peaks[g] = max(self._peaks[g], rss)
        for groups in self.RSS_SETS:
            self._peaks[groups] = max(self._peaks[groups], sum(per.get(g, 0) for g in groups))
        self._samples += 1
        return tree

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "Probe":
        self._start = self._sample()
        self._watch0 = {pid: p.cpu for pid in self.watch if (p := _read_stat(pid)) is not None}
        self._thread = threading.Thread(target=self._loop, name="bench-probe", daemon=True)
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        self._stop.set()
        self._thread.join()
        end = self._sample()
        cpu: dict[str, float] = collections.defaultdict(float)
        for pid, (p, group) in end.items():
            before = self._start[pid][0].cpu if pid in self._start else 0.0
            cpu[group] += p.cpu - before
        for pid, (p, _) in self._start.items():
            if pid not in end and p.ppid in end:  # reaped by a parent of the tree: its whole life is in cutime
                cpu[end[p.ppid][1]] -= p.cpu
        extra = {pid: p.cpu - self._watch0[pid] for pid in self._watch0 if (p := _read_stat(pid)) is not None}
        self.usage = Usage(
            wall=wall, cpu=dict(cpu),
            peak_rss={g: v for g, v in self._peaks.items() if isinstance(g, str)},
            peak_rss_of={g: v for g, v in self._peaks.items() if isinstance(g, tuple)},
            extra_cpu=extra, peak_cores=self._peak_cores(), samples=self._samples,
        )

    def _peak_cores(self, window: float = 1.0) -> dict[str, float]:
        """The highest CPU rate of each group over any stretch of at least ``window`` seconds between samples."""
        peaks: dict[str, float] = collections.defaultdict(float)
        series = self._series
        j = 0
        for i, (t0, acc0) in enumerate(series):
            j = max(j, i + 1)
            while j < len(series) and series[j][0] - t0 < window:
                j += 1
            if j == len(series):
                break
            t1, acc1 = series[j]
            for g, v in acc1.items():
                peaks[g] = max(peaks[g], (v - acc0.get(g, 0.0)) / (t1 - t0))
        return dict(peaks)


# ---- the scripted server --------------------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(latency: float, policy: str = "rollout.models.policies:bash_echo") -> Iterator[tuple[str, int]]:
    """The scripted OpenAI-compatible server in its own process (its own core and GIL); yields (url, pid)."""
    code = (
        "from cluster.serving.scripted_server.server import serve, ScriptedServerConfig; "
        f"serve(ScriptedServerConfig(latency={latency!r}, policy={policy!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError("the scripted server did not start")
        yield line.rsplit(" ", 1)[-1], proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def server_stats(url: str, reset: bool = False) -> dict:
    """The scripted server's counters (requests by status, in-flight high-water mark); ``reset`` zeroes them."""
    import json
    import urllib.request

    root = url.rsplit("/v1", 1)[0]
    request = urllib.request.Request(root + "/admin/stats", method="DELETE" if reset else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


# ---- profiles ---------------------------------------------------------------------------------------------


def py_spy_path() -> str | None:
    """py-spy next to this interpreter (``pip install py-spy``), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    from shutil import which

    return which("py-spy")


def start_py_spy(pid: int, seconds: float, out: str, rate: int = 50) -> subprocess.Popen | None:
    """Sample ``pid`` for ``seconds`` without stopping it (collapsed stacks to ``out``); None without py-spy."""
    exe = py_spy_path()
    if exe is None:
        return None
    argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", str(rate),
            "--format", "raw", "--nonblocking", "--output", out]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def summarize_profile(path: str, top: int = 12) -> list[str]:
    """Lines of a collapsed-stack profile: the busiest functions by self and by inclusive samples."""
    self_n: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    try:
        with open(path) as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                n = int(count)
                frames = [_short(fr) for fr in stack.split(";") if not fr.startswith("process ")
                          and not fr.startswith("thread ")]
                if not frames:
                    continue
                total += n
                self_n[frames[-1]] += n
                for fr in set(frames):
                    incl[fr] += n
    except OSError as exc:
        return [f"(no profile: {exc})"]
    if not total:
        return ["(the profile has no samples)"]
    lines = [f"{total} samples of non-idle threads"]
    lines.append("  self%  function")
    lines += [f"  {100 * n / total:5.1f}  {fr}" for fr, n in self_n.most_common(top)]
    lines.append("  incl%  function (project code and the libraries it calls)")
    project = [(fr, n) for fr, n in incl.most_common() if _interesting(fr)][:top]
    lines += [f"  {100 * n / total:5.1f}  {fr}" for fr, n in project]
    return lines


def _short(frame: str) -> str:
    """``fn (/long/path/site-packages/pkg/mod.py:12)`` → ``fn (pkg/mod.py:12)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    else:
        parts = where.split("/")
        where = "/".join(parts[-2:]) if len(parts) > 1 else where
    return f"{name} ({where})"


def _interesting(frame: str) -> bool:
    where = frame.rsplit("(", 1)[-1]
    return any(where.startswith(p) for p in ("rollout/", "envs/", "agents/", "cluster/", "aiohttp/", "pydantic",
                                             "ray/", "asyncio/", "json/", "orjson", "jinja2/"))
