"""The agent server under load: N concurrent ``POST /run`` of calculator rows vs the same rollouts through
``RolloutFarm.generate`` directly, on the same farm (the calculator resources server and the scripted model on the
scripted server over 127.0.0.1, both in this process's threads).

    python tests/perf/bench_gym.py                      # 200 concurrent requests, local and ray backends
    python tests/perf/bench_gym.py --n 400 --backend ray --profile

Per backend, three sides in one run:

- direct: ``RolloutFarm.generate`` of the N rows at once (the baseline: the farm without the agent server);
- ``POST /run``: the agent server (``cluster.gym.agent_app``) on a thread of its own, as ``rollout gym serve``
  runs it in process answering N concurrent requests from a client in a process of its own (aiohttp, one connection per
  request), so the client's CPU is not the server's;
- the HTTP floor: the same client against a plain FastAPI ``/run`` on the same kind of server answering a stored
  reply of the same size (no farm): what HTTP costs here before any of our code runs.

The row gives /run's rate as a share of direct's (target >= 0.9x), its cost per request beyond direct, and that
cost beyond the HTTP floor (ours). Every side is checked: all N rollouts completed (direct) or answered 200 with a
reward (/run, floor); a side that did not prints why and no ratio. ``--profile`` samples this process with py-spy
during the /run side and prints where its time went.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PERF = Path(__file__).resolve().parent
HERE = {"app": "scripted", "in_process": True}  # a scripted policy played on the farm's own event loop
sys.path.insert(0, str(PERF.parents[1]))
sys.path.insert(0, str(PERF))

from _sides import Side, failed, one_line, ratio  # noqa: E402

TARGET = 0.9
CLIENT = r'''
import asyncio, json, sys, time
import aiohttp


async def main(url, rows):
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def one(row):
            try:
                async with session.post(url + "/run", json=row) as reply:
                    body = await reply.read()
                    if reply.status != 200:
                        return f"HTTP {reply.status}: {body[:300].decode(errors='replace')}"
                    return json.loads(body).get("reward")
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
        await one(rows[0])  # connection set-up and the server's first request, untimed
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(r) for r in rows))
        print(json.dumps({"wall": time.perf_counter() - t0, "replies": got}))

asyncio.run(main(sys.argv[1], json.load(sys.stdin)))
'''


def post_all(url: str, rows: list[dict]) -> tuple[float, Side, list[float]]:
    """Wall seconds of N concurrent ``POST /run`` from a client process of its own, that side's record, the
    rewards."""
    done = subprocess.run([sys.executable, "-c", CLIENT, url], input=json.dumps(rows), capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        return float("nan"), Side("POST /run", len(rows), 0, f"client exit {done.returncode}: "
                                                            f"{one_line(done.stderr)}"), []
    out = json.loads(done.stdout)
    rewards = [r for r in out["replies"] if isinstance(r, (int, float))]
    errors = [r for r in out["replies"] if isinstance(r, str)]
    return out["wall"], Side("POST /run", len(rows), len(rewards), errors[0] if errors else ""), rewards


def floor_app(reply: dict):
    """A plain FastAPI ``/run`` answering a stored reply (the same size as the agent server's): the HTTP floor."""
    from fastapi import FastAPI
    from starlette.responses import Response

    body = json.dumps(reply).encode()
    app = FastAPI()

    async def run(request):  # the agent server's handler reads and parses the body the same way
        json.loads(await request.body())
        return Response(body, media_type="application/json")

    app.router.add_route("/run", run, methods=["POST"])
    return app


def measure(backend: str, n: int, rounds: int, profile: bool) -> dict:
    from cluster.config.gym_section import GymSection
    from cluster.farm.rollout_farm import RolloutFarm
    from cluster.gym.agent_app import EpisodeRunner, build_app
    from cluster.gym.rows import legacy_task, verify_reply
    from envs.resources.calc_server import calc_rows, create_app
    from envs.resources.serving import serve_in_thread

    rows = calc_rows(n, seed=11)
    walls: dict[str, list[float]] = {"direct": [], "served": []}
    sides: dict[str, list[Side]] = {"direct": [], "served": []}
    rewards: dict[str, list[float]] = {"direct": [], "served": []}
    profile_lines: list[str] = []
    with serve_in_thread(create_app()) as calc:
        config = {"model": {"type": "openai", "return_token_ids": True, "logprobs": True},
                  "serve": {**HERE, "policy": "calculator"}, "agent": {"type": "tool_calling", "max_steps": 6},
                  "environment": {"type": "resources", "url": calc.url}, "farm": {"backend": backend},
                  "run": {"concurrency": n}}
        farm = RolloutFarm.from_config(config, concurrency=n).start()
        try:
            warm = legacy_task(rows[0], "warm")
            sample = farm.generate([warm]).groups[0].results[0]  # connections, imports; its reply is the floor's
            runner = EpisodeRunner(farm, GymSection(max_concurrent_episodes=n))
            with serve_in_thread(build_app(runner)) as agent:  # as ``rollout gym serve`` runs it in process
                for index in range(rounds):  # alternating, medians: the machine is shared
                    tasks = [legacy_task(r, f"direct-{index}-{i}") for i, r in enumerate(rows)]
                    t0 = time.perf_counter()
                    batch = farm.generate(tasks)
                    walls["direct"].append(time.perf_counter() - t0)
                    results = [r for g in [*batch.groups, *batch.dropped] for r in g.results]
                    done = [r for r in results if r.status == "completed"]
                    bad = next((r for r in results if r.status != "completed"), None)
                    sides["direct"].append(Side("direct", n, len(done), f"{bad.status}: "
                                                f"{bad.error.message if bad.error else ''}" if bad else ""))
                    rewards["direct"] += [r.reward for r in done]
                    spy = start_profile(profile and index == rounds - 1)
                    wall, side, got = post_all(agent.url, rows)
                    walls["served"].append(wall)
                    sides["served"].append(side)
                    rewards["served"] += got
                    profile_lines = stop_profile(spy) or profile_lines
        finally:
            farm.close()
    with serve_in_thread(floor_app(verify_reply(sample, warm.gym.row))) as plain:
        floor, floor_side, _ = post_all(plain.url, rows)
    floor_side.name = "HTTP floor"
    merged = {key: Side(name, sum(x.total for x in sides[key]), sum(x.done for x in sides[key]),
                        next((x.error or x.failure() for x in sides[key] if not x.ok), ""))
              for key, name in (("direct", "direct"), ("served", "POST /run"))}
    med = {key: statistics.median(v) if v else float("nan") for key, v in walls.items()}
    return {"backend": backend, "n": n, "rounds": walls, "direct": med["direct"], "served": med["served"],
            "floor": floor, "sides": (merged["direct"], merged["served"], floor_side),
            "rewards": (rewards["direct"], rewards["served"]), "profile": profile_lines}


def start_profile(profile: bool):
    if not profile:
        return None
    from _farm_bench_util import start_py_spy

    out = f"/tmp/bench-gym-{os.getpid()}.txt"
    return start_py_spy(os.getpid(), 3600, out, rate=200), out


def stop_profile(spy) -> list[str]:
    if not spy:
        return []
    import signal

    from _farm_bench_util import summarize_profile

    proc, out = spy
    if proc is None:
        return ["(no py-spy)"]
    proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled so far
    proc.wait(timeout=60)
    return summarize_profile(out, top=25)


def report(rows: list[dict]) -> int:
    print(f"\n{'backend':<8}{'n':>5}{'direct s':>10}{'/run s':>9}{'floor s':>9}{'/run rate':>11}"
          f"{'+ms/req':>9}{'ours ms':>9}  target >= {TARGET}x of direct")
    code = 0
    for r in rows:
        direct_side, run_side, floor_side = r["sides"]
        n = r["n"]
        shown = ratio(r["direct"], r["served"], direct_side, run_side)
        if shown.startswith("no ratio"):
            print(f"{r['backend']:<8}{n:>5}  {shown}")
            code = 1
            continue
        extra = (r["served"] - r["direct"]) / n * 1000
        ours = "-" if failed(floor_side) else f"{(r['served'] - r['direct'] - r['floor']) / n * 1000:+.1f}"
        met = "met" if r["direct"] / r["served"] >= TARGET else "NOT met"
        print(f"{r['backend']:<8}{n:>5}{r['direct']:>10.2f}{r['served']:>9.2f}{r['floor']:>9.2f}{shown:>11}"
              f"{extra:>+9.1f}{ours:>9}  {met}")
        rounds = r["rounds"]
        print(f"{'':<8}rounds: direct {' '.join(f'{w:.2f}' for w in rounds['direct'])}, /run "
              f"{' '.join(f'{w:.2f}' for w in rounds['served'])}")
        means = [sum(x) / len(x) if x else float("nan") for x in r["rewards"]]
        print(f"{'':<8}rollouts/s direct {n / r['direct']:.1f}, /run {n / r['served']:.1f}; mean reward direct "
              f"{means[0]:.2f}, /run {means[1]:.2f}; HTTP floor {r['floor'] / n * 1000:.1f} ms/req "
              + (failed(floor_side) or "(a plain FastAPI /run answering a stored reply, same client)"))
        for line in r["profile"]:
            print(f"{'':<8}{line}")
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--backend", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of direct and /run (medians)")
    parser.add_argument("--profile", action="store_true", help="py-spy this process during the last /run side")
    args = parser.parse_args()
    rows = [measure(backend, args.n, args.rounds, args.profile) for backend in args.backend]
    return report(rows)


if __name__ == "__main__":
    sys.exit(main())
