"""Exact token data per rollout: the contiguity check and the trainer's segments.

A multi-turn rollout is one token sequence only when every turn's prompt begins with the previous turn's
prompt + completion ("each prompt begins with all earlier tokens", as NeMo RL asserts). Chat mode can break
that: a template that drops earlier reasoning, or tool-call text that re-tokenizes differently from the ids the
engine sampled. ``contiguity_breaks`` names the first turn and offset of each break; ``segments`` cuts the
rollout there into samples a trainer can use, never re-tokenizing anything. Token-in mode
(``rollout.models.client.token_in``) never breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence


@dataclass
class TokenBreak:
    turn: int
    """The 1-based turn whose prompt does not extend the previous prompt + completion."""
    offset: int
    """The first token position (in that prompt) that differs; the previous length when the prompt is shorter."""
    expected: int
    """How many tokens the prompt should have begun with (previous prompt + completion)."""

    def as_dict(self) -> dict[str, int]:
        return {"turn": self.turn, "offset": self.offset, "expected": self.expected}


@dataclass
class Segment:
    """One trainer sample: a prompt and a response of model tokens (mask 1) and observation tokens (mask 0)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Per response token: the engine's logprob on model tokens, 0.0 on observation tokens."""
    turns: list[int] = field(default_factory=list)
    """The 1-based turns whose completions are in this segment."""

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_ids": self.prompt_ids, "response_ids": self.response_ids, "loss_mask": self.loss_mask,
                "logprobs": self.logprobs, "turns": self.turns}


def _ids(step: Any, name: str) -> list[int] | None:
    value = step.get(name) if isinstance(step, dict) else getattr(step, name, None)
    return list(value) if value is not None else None


def has_token_data(steps: Sequence[Any]) -> bool:
    return bool(steps) and all(_ids(s, "prompt_token_ids") is not None and _ids(s, "completion_token_ids")
                               is not None for s in steps)


def contiguity_breaks(steps: Sequence[Any]) -> list[TokenBreak]:
    """Every turn whose prompt does not begin with the previous turn's prompt + completion (steps or their dicts,
    each with ``prompt_token_ids`` and ``completion_token_ids``)."""
    breaks = []
    for k in range(1, len(steps)):
        before = (_ids(steps[k - 1], "prompt_token_ids") or []) + (_ids(steps[k - 1], "completion_token_ids") or [])
        prompt = _ids(steps[k], "prompt_token_ids") or []
        if prompt[: len(before)] != before:
            offset = next((i for i, (a, b) in enumerate(zip(prompt, before)) if a != b), min(len(prompt), len(before)))
            breaks.append(TokenBreak(turn=k + 1, offset=offset, expected=len(before)))
    return breaks


def segments(steps: Sequence[Any], on_break: Literal["split", "mask"] = "split") -> list[Segment]:
    """The rollout as trainer samples. Each starts at a turn's prompt; later turns that extend it add their
    observation tokens (mask 0, logprob 0) and completion (mask 1, the engine's logprobs). At a break a new
    segment starts from that turn's own prompt (``split``), or the segments after the first break keep their
    tokens with mask 0 everywhere (``mask``: nothing past the break is trained on)."""
    if on_break not in ("split", "mask"):
        raise ValueError(f"on_break must be 'split' or 'mask', got {on_break!r}")
    broken = {b.turn for b in contiguity_breaks(steps)}
    out: list[Segment] = []
    seen: list[int] = []  # the current segment's full sequence so far
    for k, step in enumerate(steps, start=1):
        prompt = _ids(step, "prompt_token_ids") or []
        completion = _ids(step, "completion_token_ids") or []
        logprobs = _ids(step, "logprobs") or [0.0] * len(completion)
        if not out or k in broken:
            out.append(Segment(prompt_ids=prompt))
            seen = list(prompt)
        else:
            delta = prompt[len(seen):]
            out[-1].response_ids += delta
            out[-1].loss_mask += [0] * len(delta)
            out[-1].logprobs += [0.0] * len(delta)
        seg = out[-1]
        seg.response_ids += completion
        seg.loss_mask += [1] * len(completion)
        sampled = [float(x) for x in logprobs[: len(completion)]]
        seg.logprobs += sampled + [0.0] * (len(completion) - len(sampled))
        seg.turns.append(k)
        seen = prompt + completion
    if on_break == "mask":
        for seg in out[1:]:
            seg.loss_mask = [0] * len(seg.loss_mask)
    return out
