"""TRL's ``GRPOTrainer`` around the farm's rollout function: the ``GRPOConfig`` that mirrors the RL example's step
(one optimizer step over the whole generation batch, ``num_iterations`` of them per batch, clip 0.2, no KL term,
AdamW at a constant rate, float32 on the CPU) and the dataset of the RL example's training problems, one prompt per
problem (``examples.rl_cpu.tasks``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.rl_cpu import tasks as T
from examples.trl_cpu.rollout import FarmRollout, verifier_reward


def training_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` training problems whose prompts are all different (a prompt names its problem for the rollout
    function: two level-4 problems may differ only in their price tables, so one of them is left out)."""
    rows, seen = [], set()
    for row in T.make_tasks(2 * count, seed, "train"):
        if row["prompt"] not in seen and len(rows) < count:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def grpo_config(out_dir: Path, *, steps: int, tasks: int, n: int, lr: float, epochs: int, clip: float, beta: float,
                loss_type: str, micro_batch: int, seed: int) -> Any:
    """The run's ``GRPOConfig``: ``tasks`` problems x ``n`` samples per generation, split into micro-batches of
    ``micro_batch`` accumulated into one optimizer step, ``epochs`` (TRL's ``num_iterations``) steps per generation,
    ``steps`` generations; TRL logs once per generation."""
    from trl import GRPOConfig

    if (tasks * n) % micro_batch:
        raise ValueError(f"--micro-batch {micro_batch} must divide the generation batch ({tasks} x {n})")
    return GRPOConfig(
        output_dir=str(out_dir / "trl"), use_cpu=True, bf16=False, gradient_checkpointing=False, seed=seed,
        per_device_train_batch_size=micro_batch, gradient_accumulation_steps=tasks * n // micro_batch,
        num_generations=n, num_iterations=epochs, max_steps=steps * epochs, learning_rate=lr,
        lr_scheduler_type="constant", adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        beta=beta, loss_type=loss_type, epsilon=clip, scale_rewards="group", logging_steps=epochs,
        report_to="none", save_strategy="no", disable_tqdm=True, remove_unused_columns=False,
        dataloader_num_workers=0)


def grpo_trainer(model: Any, tokenizer: Any, rows: list[dict[str, Any]], rollout: FarmRollout, config: Any) -> Any:
    """A ``GRPOTrainer`` whose every generation is the farm's (``rollout_func``) and whose reward is the farm's
    verifier's; TRL's own per-step printout is left out (the example prints a line per generation)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    data = Dataset.from_list([{"prompt": r["prompt"], "task_id": r["task_id"]} for r in rows])
    trainer = GRPOTrainer(model=model, reward_funcs=verifier_reward, args=config, train_dataset=data,
                          processing_class=tokenizer, rollout_func=rollout)
    trainer.remove_callback(PrinterCallback)
    return trainer


def reward_curve(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """TRL's logged reward per logging step (one per generation here): step, reward, its std, the share of groups
    whose rewards were all equal, and the loss."""
    return [{"step": h["step"], "reward": h["reward"], "reward_std": h.get("reward_std"),
             "frac_reward_zero_std": h.get("frac_reward_zero_std"), "loss": h.get("loss")}
            for h in log_history if h.get("reward") is not None]
