"""Container runtime overheads, side by side in one run on one image (ratios: the machine is noisy).

    python tests/perf/bench_runtime.py [--image rollout-farm/base:bookworm] [--samples 30]

- exec: p50/p95 of `true` through DockerRuntime.exec vs the raw `docker exec` CLI (target <= 1.1x)
- start: DockerRuntime.start vs raw `docker run -d` (target <= 1.2x)
- first command: warm pool vs cold start + exec (target <= 0.5x cold, <= 1.2x a plain exec)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sides import Side, one_line  # noqa: E402

from envs.runtimes.docker.runtime import DockerRuntime
from envs.runtimes.warm_pool import WarmPool

LABELS = ["--label", "rollout-farm.run=bench-runtime"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cli(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def raw_start(image: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    cid = cli("docker", "run", "-d", "--rm", "--network", "none", *LABELS, image, "sleep", "600")
    return time.perf_counter() - t0, cid


def raw_exec(cid: str) -> float:
    t0 = time.perf_counter()
    cli("docker", "exec", cid, "bash", "-lc", "true")
    return time.perf_counter() - t0


async def ours_start(config: dict) -> tuple[float, DockerRuntime]:
    runtime = DockerRuntime(config, run_id="bench-runtime", rollout_id="start")
    t0 = time.perf_counter()
    await runtime.start()
    return time.perf_counter() - t0, runtime


async def ours_exec(runtime: DockerRuntime) -> float:
    t0 = time.perf_counter()
    result = await runtime.exec("true")
    if result.returncode != 0:
        raise RuntimeError(f"exec `true` returned {result.returncode}: {result.output}")
    return time.perf_counter() - t0


async def measure(args: argparse.Namespace) -> list[tuple[str, float, float, float, float, float, str]]:
    config = {"image": args.image}
    n = args.samples
    rows = []

    # exec: one container each, n samples after a warm-up
    _, ours_rt = await ours_start(config)
    _, cid = raw_start(args.image)
    try:
        await ours_exec(ours_rt)
        raw_exec(cid)
        ours = [await ours_exec(ours_rt) for _ in range(n)]
        raw = [raw_exec(cid) for _ in range(n)]
    finally:
        await ours_rt.close()
        cli("docker", "rm", "-f", cid)
    rows.append(("exec `true` p50", statistics.median(ours), statistics.median(raw), 1.1,
                 pct(ours, 0.95), pct(raw, 0.95), "raw: docker exec CLI"))

    # start
    ours, raw = [], []
    for _ in range(max(5, n // 3)):
        seconds, runtime = await ours_start(config)
        ours.append(seconds)
        await runtime.close()
        seconds, cid = raw_start(args.image)
        raw.append(seconds)
        cli("docker", "rm", "-f", cid)
    rows.append(("container start p50", statistics.median(ours), statistics.median(raw), 1.2, pct(ours, 0.95),
                 pct(raw, 0.95), "raw: docker run -d CLI"))

    # time to first command: cold (start + exec) vs a warm pool (acquire + exec)
    cold, warm, plain = [], [], []
    pool = WarmPool(lambda: DockerRuntime(config, run_id="bench-runtime", rollout_id="pool"), size=2)
    pool.fill()
    try:
        for _ in range(max(5, n // 3)):
            t0 = time.perf_counter()
            seconds, runtime = await ours_start(config)
            await ours_exec(runtime)
            cold.append(time.perf_counter() - t0)
            plain.append(await ours_exec(runtime))
            await runtime.close()
            while pool.ready < 1:  # a rollout arriving after the pool had time to refill
                await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            runtime = await pool.acquire()
            await ours_exec(runtime)
            warm.append(time.perf_counter() - t0)
            await runtime.close()
    finally:
        await pool.close()
    rows.append(("first command, warm vs cold", statistics.median(warm), statistics.median(cold), 0.5,
                 pct(warm, 0.95), pct(cold, 0.95), "baseline: cold start + exec"))
    rows.append(("first command, warm vs exec", statistics.median(warm), statistics.median(plain), 1.2,
                 pct(warm, 0.95), pct(plain, 0.95), "baseline: a plain exec"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="rollout-farm/base:bookworm")
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args(argv)
    try:
        rows = asyncio.run(measure(args))
    except Exception as exc:  # noqa: BLE001 - a side that failed gives no row, and the table says which side
        if isinstance(exc, subprocess.CalledProcessError):
            side = Side("docker CLI", 1, 0, f"{' '.join(exc.cmd[:3])} exit {exc.returncode}: "
                                            f"{one_line(exc.stderr or exc.stdout or '')}")
        else:
            side = Side("DockerRuntime", 1, 0, f"{type(exc).__name__}: {one_line(str(exc))}")
        print(f"no ratio: {side.failure()}")
        return 1
    print("measure | ours ms | baseline ms | ratio | target | ours p95 ms | baseline p95 ms | baseline")
    for name, ours, base, target, ours95, base95, what in rows:
        print(f"{name} | {ours * 1e3:.1f} | {base * 1e3:.1f} | {ours / base:.2f} | <= {target} | "
              f"{ours95 * 1e3:.1f} | {base95 * 1e3:.1f} | {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
