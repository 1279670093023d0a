"""TRL's ``rollout_func`` over the farm: before each generation the trainer's current weights are saved and loaded into
the farm's engine (``farm.reload_weights``, labelled with the trainer's step), the engine's logprobs of a probe
completion are compared with the trainer's, and the groups TRL asks for run as ``RolloutFarm.generate`` in token-in
mode. What goes back to TRL is each rollout's token stream exactly as sampled: ``prompt_ids`` (the first turn's
prompt), ``completion_ids`` (every later token: the model's completions and the tool outputs between them),
``logprobs`` (the engine's, 0.0 on tool tokens) and ``env_mask`` (1 on the model's own tokens), plus the farm's
verifier's reward (``verifier_reward``, read by TRL through the reward function of the same name).

TRL hands the rollout function its prompts only, each repeated ``num_generations`` times in a row: a prompt names its
problem (the dataset's prompts are unique), and each run of equal prompts is one farm group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.rl_cpu import tasks as T
from examples.rl_cpu.grpo import logprob_agreement, save
from examples.rl_cpu.loop import Loop, check_samples
from examples.rl_cpu.rendering import render

TOKEN_FIELDS = ("prompt_ids", "completion_ids", "logprobs", "env_mask")


def verifier_reward(prompts: list, completions: list, verifier_reward: list, farm_task_id: list, task_id: list,
                    **kwargs: Any) -> list[float | None]:
    """TRL's reward function: the farm verifier's reward of each rollout, as ``rollout_func`` returned it (None for a
    member that failed on infrastructure: TRL leaves it out of its group's statistics). The rollout's task must be
    the dataset row TRL drew (the prompts went to the farm and came back in order)."""
    if list(farm_task_id) != list(task_id):
        raise AssertionError("the farm's rollouts are not in the order of TRL's prompts")
    return list(verifier_reward)


@dataclass
class FarmRollout:
    """The ``rollout_func`` of a ``GRPOTrainer``: ``rollout(prompts, trainer) -> dict`` (TRL's fields)."""
    loop: Loop
    """The RL example's parts: the served policy, the farm, the trainer's model and tokenizer, the held-out split,
    ``probe`` (engine vs trainer logprobs of a greedy completion) and ``evaluate``."""
    rows: dict[str, dict[str, Any]]
    """The training problems by prompt."""
    weights_dir: Path
    seed: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    """One row per generation: version, reload and probe, timings, token counts, rewards, agreement (the first)."""

    def sync(self, trainer: Any) -> dict[str, Any]:
        """The trainer's weights now into the engine, labelled with the trainer's step; the probe's agreement after
        the reload (``engine_vs_trainer``) and before it (``before_vs_trainer``: how far the weights had moved)."""
        import torch

        model = trainer.accelerator.unwrap_model(trainer.model)
        version = str(trainer.state.global_step)
        t0 = time.perf_counter()
        path = save(model, trainer.processing_class, self.weights_dir / f"step-{version}")
        saved = time.perf_counter()
        self.loop.model = model
        with torch.no_grad():
            before = self.loop.probe()  # the engine's weights before the reload, against the trainer's now
        t1 = time.perf_counter()
        self.loop.farm.reload_weights(str(path), version=version)
        reloaded = time.perf_counter()
        with torch.no_grad():
            probe = self.loop.probe()
        return {"version": version, "save_s": saved - t0, "reload_s": reloaded - t1,
                "engine_vs_trainer": probe["max_abs"], "before_vs_trainer": before["max_abs"],
                "probe_tokens": len(probe["ids"]), "engine_version": str(self.loop.farm.policy_version)}

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        n = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        groups = [prompts[i: i + n] for i in range(0, len(prompts), n)]
        if any(len(g) != n or any(p != g[0] for p in g) for g in groups):
            raise ValueError(f"TRL's prompts do not come in runs of {n} equal prompts")
        row: dict[str, Any] = {"generation": len(self.history), **self.sync(trainer)}
        tasks = [self.rows[g[0]] for g in groups]
        t0 = time.perf_counter()
        batch = self.loop.farm.generate(tasks, n=n, seed=self.seed + 100_000 * (len(self.history) + 1))
        row["generate_s"] = time.perf_counter() - t0
        samples = batch.samples(on_break="mask")  # one sample per completed rollout
        row.update(check_samples(batch, samples, {row["version"]}))  # mask, logprobs, versions: the engine's
        row.update(versions=batch.versions(), failed=batch.failed, rollouts=len(batch.results),
                   train_reward=sum(s.reward for s in samples) / max(1, len(samples)),
                   mean_turns=sum(s.num_turns for s in samples) / max(1, len(samples)))
        if not self.history:  # the trainer's logprobs of the engine's tokens, before any update
            import torch

            with torch.no_grad():
                row["agreement"] = logprob_agreement(self.loop.model, samples)
        out = self.for_trl(tasks, batch, samples, n, trainer.processing_class)
        row["contract"] = same_tokens(out, samples)
        self.history.append(row)
        return out

    def for_trl(self, tasks: list[dict[str, Any]], batch: Any, samples: list[Any], n: int,
                tokenizer: Any) -> dict[str, list]:
        """TRL's fields, one entry per (task, member) in TRL's order; beside the required ones, ``env_mask``,
        ``verifier_reward``, and per rollout its task, its stop reason and the engine's version label (TRL hands the
        extra fields to the reward function). A member that failed has no tokens to learn from: a one-token
        placeholder, masked, with no reward (TRL gives it no advantage)."""
        by_key = {(s.task_id, s.sample_index): s for s in samples}
        results = {(r.task_id, r.sample_index): r for r in batch.results}
        out: dict[str, list] = {key: [] for key in (*TOKEN_FIELDS, "verifier_reward", "farm_task_id", "exit_reason",
                                                     "policy_version")}
        for task in tasks:
            for index in range(n):
                s, result = by_key.get((task["task_id"], index)), results.get((task["task_id"], index))
                if s is None:
                    prompt = render(tokenizer, [{"role": "user", "content": task["prompt"]}], T.tool_schemas(), True)
                    values = (prompt, [tokenizer.eos_token_id], [0.0], [0], None)
                else:
                    values = (list(s.prompt_ids), list(s.response_ids), list(s.logprobs), list(s.loss_mask),
                              s.reward)
                for key, value in zip((*TOKEN_FIELDS, "verifier_reward"), values):
                    out[key].append(value)
                out["farm_task_id"].append(task["task_id"])
                out["exit_reason"].append(result.exit_reason.value if result is not None else "not_started")
                versions = {v for v, m in zip(s.policy_versions, s.loss_mask) if m} if s is not None else set()
                out["policy_version"].append(",".join(sorted(versions)))
        return out


def same_tokens(out: dict[str, list], samples: list[Any]) -> dict[str, int]:
    """What TRL is handed, checked against the farm's samples token for token: ``{"samples", "model_tokens",
    "tool_tokens"}``. Raises when an id, logprob or mask entry differs."""
    by_ids = {(tuple(s.prompt_ids), tuple(s.response_ids)): s for s in samples}
    seen = model = tool = 0
    for prompt, completion, logprobs, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"],
                                                  out["env_mask"]):
        s = by_ids.get((tuple(prompt), tuple(completion)))
        if s is None:
            continue  # a failed member's placeholder
        if logprobs != list(s.logprobs) or mask != list(s.loss_mask) or len(mask) != len(completion):
            raise AssertionError(f"{s.rollout_id}: TRL would get other logprobs or another mask than the engine's")
        seen, model, tool = seen + 1, model + sum(mask), tool + len(mask) - sum(mask)
    if seen != len(samples):
        raise AssertionError(f"{len(samples) - seen} of the farm's samples did not reach TRL")
    return {"samples": seen, "model_tokens": model, "tool_tokens": tool}
