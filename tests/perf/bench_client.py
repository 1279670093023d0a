"""Client throughput: N concurrent multi-turn rollouts against the scripted server, ours vs the openai SDK.

Little's law: with every rollout in flight at once, the ideal wall time is turns x latency,
whatever N is. The ratio to that ideal is the client's (and the machine's) overhead.

    python tests/perf/bench_client.py --rollouts 2000 --turns 3 --latency 1

A variant is an async context manager ``variant(url, args)`` yielding ``one_rollout(i)``;
add one to ``VARIANTS`` to measure another path (e.g. a full agent loop through run_rollout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sides import Side, ratio  # noqa: E402

from rollout.gc_tuning import tune_gc
from rollout.models.client.model import OpenAIModel, OpenAIModelConfig
from rollout.records import RequestMeta
from rollout.wire.chat import raise_open_file_limit

Rollout = Callable[[int], Awaitable[None]]


def observation(turn: int) -> dict:
    return {"role": "user", "content": f"<returncode>0</returncode>\n<output>step {turn}</output>"}


@contextlib.asynccontextmanager
async def ours(url: str, args: argparse.Namespace, client: str = "aiohttp") -> AsyncIterator[Rollout]:
    model = OpenAIModel(OpenAIModelConfig(base_url=url, model="scripted", timeout=120, http_client=client))

    async def one_rollout(i: int) -> None:
        meta = RequestMeta(rollout_id=f"bench-{i}", task_id=f"task-{i}")
        messages = [{"role": "user", "content": f"task {i}: fix the bug"}]
        for turn in range(1, args.turns + 1):
            response = await model.complete(messages, meta=meta)
            messages += [response.message, observation(turn)]

    try:
        yield one_rollout
    finally:
        await model.aclose()


@contextlib.asynccontextmanager
async def openai_sdk(url: str, args: argparse.Namespace) -> AsyncIterator[Rollout]:
    from openai import AsyncOpenAI  # default httpx client and connection limits

    client = AsyncOpenAI(base_url=url, api_key="unused", timeout=120)

    async def one_rollout(i: int) -> None:
        messages = [{"role": "user", "content": f"task {i}: fix the bug"}]
        for turn in range(1, args.turns + 1):
            response = await client.chat.completions.create(
                model="scripted", messages=messages, extra_headers={"X-Rollout-Id": f"bench-{i}"}
            )
            messages += [response.choices[0].message.model_dump(exclude_none=True), observation(turn)]

    try:
        yield one_rollout
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def agent_rollouts(url: str, args: argparse.Namespace) -> AsyncIterator[Rollout]:
    """Whole rollouts: the Mini-SWE agent loop (parse, execute on the null runtime, observe) over our client."""
    from agents.swe_agent import MiniSweAgent
    from envs.runtimes.null import NullRuntime, NullRuntimeConfig
    from envs.shell_env import ShellEnvironment
    from rollout.errors import ExitReason
    from rollout.records import Task
    from rollout.runner import run_rollout

    model = OpenAIModel(OpenAIModelConfig(base_url=url, model="scripted", timeout=120))
    agent = MiniSweAgent()

    async def one_rollout(i: int) -> None:
        task = Task(task_id=f"task-{i}", prompt="fix the bug")
        env = ShellEnvironment(NullRuntime(NullRuntimeConfig(echo=True)))
        meta = RequestMeta(rollout_id=f"bench-{i}", task_id=task.task_id)
        result = await run_rollout(task, agent, model, env, meta=meta)
        if result.exit_reason != ExitReason.SUBMITTED or len(result.trajectory.steps) != args.turns:
            raise RuntimeError(f"rollout {i} ended {result.exit_reason} after {len(result.trajectory.steps)} steps")

    try:
        yield one_rollout
    finally:
        await model.aclose()


@contextlib.asynccontextmanager
async def bare_aiohttp(url: str, args: argparse.Namespace) -> AsyncIterator[Rollout]:
    """The floor: the same requests with a bare aiohttp session and none of our code."""
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def one_rollout(i: int) -> None:
        messages = [{"role": "user", "content": f"task {i}: fix the bug"}]
        for turn in range(1, args.turns + 1):
            body = {"model": "scripted", "messages": messages}
            async with session.post(f"{url}/chat/completions", json=body, headers={"X-Rollout-Id": f"bench-{i}"}) as r:
                data = await r.json()
            messages += [data["choices"][0]["message"], observation(turn)]

    try:
        yield one_rollout
    finally:
        await session.close()


VARIANTS: dict[str, Callable[[str, argparse.Namespace], contextlib.AbstractAsyncContextManager[Rollout]]] = {
    "bare aiohttp (no project code)": bare_aiohttp,
    "ours (aiohttp)": ours,
    "ours (built-in HTTP/1.1)": lambda url, args: ours(url, args, "auto"),
    "ours, full agent rollouts": agent_rollouts,
    "openai SDK (httpx)": openai_sdk,
}


async def measure(variant, url: str, args: argparse.Namespace) -> tuple[float, float, int, str]:
    """Wall seconds for all rollouts at once, this process's CPU seconds, how many failed and the first error."""
    async with variant(url, args) as one_rollout:
        t0, cpu0 = time.perf_counter(), time.process_time()
        results = await asyncio.gather(*(one_rollout(i) for i in range(args.rollouts)), return_exceptions=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        print(f"  {len(failed)} failed, e.g. {type(failed[0]).__name__}: {failed[0]}", file=sys.stderr)
    first = f"{type(failed[0]).__name__}: {failed[0]}" if failed else ""
    return wall, cpu, len(failed), first


@contextlib.contextmanager
def server_process(latency: float):
    """The scripted server in its own process, so it does not share a core with the client."""
    code = (
        "from cluster.serving.scripted_server.server import serve, ScriptedServerConfig; "
        f"serve(ScriptedServerConfig(latency={latency!r}, policy='rollout.models.policies:bash_echo'))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip().rsplit(" ", 1)[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--only", choices=sorted(VARIANTS), action="append", help="run only these variants")
    parser.add_argument("--default-gc", action="store_true", help="keep CPython's default GC thresholds")
    args = parser.parse_args(argv)
    raise_open_file_limit()
    if not args.default_gc:
        tune_gc()  # as `rollout run` does; the scripted server process tunes its own
    ideal = args.turns * args.latency
    rows = []
    with server_process(args.latency) as url:
        for name in args.only or VARIANTS:
            wall, cpu, failed, first = asyncio.run(measure(VARIANTS[name], url, args))
            side = Side(name, args.rollouts, args.rollouts - failed, first)
            rows.append((name, args.rollouts, args.turns, args.latency, wall, ideal, ratio(wall, ideal, side), cpu,
                         failed))
    header = ("client", "rollouts", "turns", "latency", "wall s", "ideal s", "ratio", "CPU ms/request", "failed")
    print(" | ".join(header))
    for name, n, turns, latency, wall, ideal_s, shown, cpu, failed in rows:
        print(f"{name} | {n} | {turns} | {latency:g} | {wall:.2f} | {ideal_s:.2f} | {shown} | "
              f"{1000 * cpu / (n * turns):.3f} | {failed}")
    return 1 if any(row[-1] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
