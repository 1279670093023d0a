"""The agent server under load: N concurrent ``POST /run`` of calculator rows vs the same rollouts through
``RolloutFarm.generate`` directly, on the same farm (the calculator resources server and the scripted model on the
scripted server over 127.0.0.1, both in this process's threads).

    python tests/perf/bench_gym.py                 # 200 concurrent requests, local backend
    python tests/perf/bench_gym.py --n 400 --backend ray

Prints per path: wall seconds, rollouts/s, mean reward, errors; then the agent server's overhead per request
(wall difference / N) and the ratio of the two rates (noisy machines: compare within one run).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    args = parser.parse_args()
    from cluster.farm.rollout_farm import RolloutFarm
    from cluster.gym.agent_app import EpisodeRunner, build_app
    from cluster.gym.config import GymSection
    from envs.resources.calc_server import calc_rows, create_app
    from envs.resources.serving import serve_in_thread
    from rollout.records import Task

    rows = calc_rows(args.n, seed=11)
    with serve_in_thread(create_app()) as calc:
        config = {"model": {"type": "openai", "return_token_ids": True, "logprobs": True},
                  "fake_server": {"policy": "calculator"}, "agent": {"type": "tool_calling", "max_steps": 6},
                  "environment": {"type": "resources", "url": calc.url}, "farm": {"backend": args.backend},
                  "run": {"concurrency": args.n}}
        farm = RolloutFarm.from_config(config, concurrency=args.n).start()
        try:
            from cluster.gym.rows import legacy_task

            farm.generate([legacy_task(rows[0], "warm")])  # connections, imports
            tasks = [legacy_task(r, f"direct-{i}") for i, r in enumerate(rows)]
            assert all(isinstance(t, Task) for t in tasks)
            t0 = time.perf_counter()
            batch = farm.generate(tasks)
            direct = time.perf_counter() - t0
            direct_rewards = [r.reward for g in batch.groups for r in g.results]
            direct_errors = sum(1 for g in [*batch.groups, *batch.dropped] for r in g.results
                                if r.status != "completed")
            runner = EpisodeRunner(farm, GymSection(max_concurrent_episodes=args.n))
            with serve_in_thread(build_app(runner)) as agent:
                served, rewards, errors = asyncio.run(_post_all(agent.url, rows))
        finally:
            farm.close()
    print(f"{'path':<22}{'wall s':>10}{'rollouts/s':>12}{'mean reward':>13}{'errors':>8}")
    for name, wall, got, bad in (("RolloutFarm.generate", direct, direct_rewards, direct_errors),
                                 ("POST /run (HTTP)", served, rewards, errors)):
        mean = sum(got) / len(got) if got else float("nan")
        print(f"{name:<22}{wall:>10.2f}{args.n / wall:>12.1f}{mean:>13.2f}{bad:>8}")
    print(f"agent server overhead: {(served - direct) / args.n * 1000:+.1f} ms per request "
          f"(wall difference / {args.n}); rate ratio /run : direct = {direct / served:.2f}")
    return 0 if errors == 0 and direct_errors == 0 else 1


async def _post_all(url: str, rows: list[dict]) -> tuple[float, list[float], int]:
    limits = httpx.Limits(max_connections=len(rows), max_keepalive_connections=len(rows))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.post("/run", json=r) for r in rows), return_exceptions=True)
        wall = time.perf_counter() - t0
    ok = [r.json()["reward"] for r in replies if isinstance(r, httpx.Response) and r.status_code == 200]
    return wall, ok, len(rows) - len(ok)


if __name__ == "__main__":
    sys.exit(main())
