"""A batch of grouped rollouts in the shape trainers consume: one sample per token segment of each completed
rollout, with everything a policy-gradient step needs and nothing to stitch.

Per sample: ``prompt_ids`` (the first turn's prompt), ``response_ids`` (every later token: the model's
completions and the observations/template tokens between them), ``loss_mask`` (1 on the model's tokens, 0 on the
rest), ``logprobs`` (the engine's, 0.0 where masked), ``policy_versions`` (per response token, the version of the
turn it belongs to), ``reward``, and the group's advantage inputs (``group_rewards``: the rewards of the group's
completed members, their mean and std, and the GRPO advantage ``(reward - mean) / (std + 1e-6)``).

A segment break (the engine's prompt of a turn does not extend the previous turn's tokens: a chat-template drift
``rollout.train.tokens`` reports) starts a new sample of the same rollout: never a silent re-tokenization. Members that
failed on infrastructure or were marked stale have no sample; their group's statistics leave them out.

``padded(samples)`` gives the same as rectangular numpy arrays (prompts left-padded, responses right-padded).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from rollout.train.tokens import has_token_data, segments


@dataclass
class TrainerSample:
    rollout_id: str
    task_id: str
    group_id: str
    sample_index: int
    segment: int
    """Which token segment of its rollout (0 unless the rollout's token stream broke)."""
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[str | None]
    reward: float
    group_rewards: list[float] = field(default_factory=list)
    group_mean: float = 0.0
    group_std: float = 0.0
    advantage: float = 0.0
    num_turns: int = 0
    exit_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def usable(result: Any) -> bool:
    """A member a trainer may learn from: completed (a task outcome) and not marked stale."""
    return result.status == "completed" and not result.metadata.get("stale")


def group_samples(results: list[Any], on_break: str = "split") -> list[TrainerSample]:
    """The samples of one group's members (results in sample order)."""
    kept = [r for r in results if usable(r)]
    rewards = [float(r.reward or 0.0) for r in kept]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)) if rewards else 0.0
    out = []
    for r in kept:
        steps = r.trajectory.steps
        if not has_token_data(steps):
            continue
        for index, seg in enumerate(segments(steps, on_break)):
            versions: list[str | None] = []
            for turn in seg.turns:  # each turn adds its observation delta, then its completion
                step = steps[turn - 1]
                size = len(step.completion_token_ids or [])
                if turn != seg.turns[0]:
                    prior = (len(steps[turn - 2].prompt_token_ids or [])
                             + len(steps[turn - 2].completion_token_ids or []))
                    size += max(0, len(step.prompt_token_ids or []) - prior)
                versions += [step.policy_version] * size
            reward = float(r.reward or 0.0)
            out.append(TrainerSample(
                rollout_id=r.rollout_id, task_id=r.task_id, group_id=r.group_id or r.task_id,
                sample_index=r.sample_index, segment=index, prompt_ids=seg.prompt_ids,
                response_ids=seg.response_ids, loss_mask=seg.loss_mask, logprobs=seg.logprobs,
                policy_versions=versions[: len(seg.response_ids)], reward=reward, group_rewards=rewards,
                group_mean=mean, group_std=std, advantage=(reward - mean) / (std + 1e-6), num_turns=len(seg.turns),
                exit_reason=r.exit_reason.value))
    return out


def trainer_samples(groups: Iterable[Any], on_break: str = "split") -> list[TrainerSample]:
    """Every sample of the groups, in group then sample order."""
    return [s for g in groups for s in group_samples(g.results, on_break)]


def padded(samples: list[TrainerSample], pad_id: int = 0, max_prompt: int | None = None,
           max_response: int | None = None) -> dict[str, Any]:
    """Rectangular numpy arrays: ``prompt_ids`` and ``prompt_mask`` left-padded, ``response_ids``,
    ``response_mask`` (1 on real tokens), ``loss_mask`` and ``logprobs`` right-padded; ``rewards`` and
    ``advantages`` per sample. ``max_prompt``/``max_response`` cut longer sequences (prompts keep their end)."""
    import numpy as np

    p_len = max([len(s.prompt_ids) for s in samples] or [0])
    r_len = max([len(s.response_ids) for s in samples] or [0])
    p_len, r_len = min(p_len, max_prompt or p_len), min(r_len, max_response or r_len)
    n = len(samples)
    out = {"prompt_ids": np.full((n, p_len), pad_id, dtype=np.int64), "prompt_mask": np.zeros((n, p_len), np.int8),
           "response_ids": np.full((n, r_len), pad_id, dtype=np.int64),
           "response_mask": np.zeros((n, r_len), np.int8), "loss_mask": np.zeros((n, r_len), np.int8),
           "logprobs": np.zeros((n, r_len), np.float32),
           "rewards": np.array([s.reward for s in samples], np.float32),
           "advantages": np.array([s.advantage for s in samples], np.float32)}
    for i, s in enumerate(samples):
        prompt = s.prompt_ids[-p_len:] if p_len else []
        if prompt:
            out["prompt_ids"][i, p_len - len(prompt):] = prompt
            out["prompt_mask"][i, p_len - len(prompt):] = 1
        k = min(len(s.response_ids), r_len)
        out["response_ids"][i, :k] = s.response_ids[:k]
        out["response_mask"][i, :k] = 1
        out["loss_mask"][i, :k] = s.loss_mask[:k]
        out["logprobs"][i, :k] = s.logprobs[:k]
    return out


def version_distance(version: Any, current: Any) -> float:
    """How many versions ``version`` is behind ``current`` (numbers compared as numbers; otherwise 0 when equal,
    infinitely far when not; a turn without a version is as old as can be once a version is set)."""
    if current is None:
        return 0.0
    if version is None:
        return math.inf
    try:
        return float(current) - float(version)
    except (TypeError, ValueError):
        return 0.0 if str(version) == str(current) else math.inf


def staleness(result: Any, current: Any) -> float:
    """How far behind ``current`` the oldest turn of ``result`` was sampled."""
    return max((version_distance(s.policy_version, current) for s in result.trajectory.steps), default=0.0)
