"""Groups of n samples per task (GRPO style) and what a trainer does with a group that has failures.

After the farm's own retries (``max_attempts`` per sample), a member may still have failed on
infrastructure. The group policy decides what the trainer gets:

- ``mask``: the group is kept; failed members stay in place as placeholders with ``mask`` False
  (reward 0.0, never to be trained on).
- ``drop``: a group with any failed member is left out of the batch (and counted).
- ``retry``: failed members run again (up to ``max_group_retries`` more rounds, each with the
  member's own seed); what still fails after that is masked.

``min_success_fraction`` drops any group whose share of completed members is below it, whatever
the policy (a group of 8 with 2 usable samples says little about relative advantage).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from pydantic import Field

from rollout.config.load import StrictModel
from rollout.records import RolloutResult
from rollout.train.batch import padded, trainer_samples
from rollout.train.tokens import segments


class GroupPolicy(StrictModel):
    on_failure: Literal["mask", "drop", "retry"] = "mask"
    """What to do with a group that has members failed on infrastructure (after ``max_attempts``)."""
    max_group_retries: int = Field(default=1, ge=0)
    """With ``retry``: extra rounds for the failed members of a group."""
    min_success_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """Drop groups whose share of completed (non-failed) members is below this."""


@dataclass
class Group:
    """The n samples of one task, in sample order."""

    group_id: str
    task_id: str
    results: list[RolloutResult]
    dropped: bool = False
    drop_reason: str | None = None

    @property
    def mask(self) -> list[bool]:
        """True where the member completed and is not stale (usable for training)."""
        return [r.status == "completed" and not r.metadata.get("stale") for r in self.results]

    @property
    def rewards(self) -> list[float]:
        """Rewards in sample order; 0.0 for masked members and for completed ones without a reward."""
        return [float(r.reward or 0.0) if usable else 0.0 for r, usable in zip(self.results, self.mask)]

    @property
    def seeds(self) -> list[int | None]:
        return [r.seed for r in self.results]

    @property
    def success_fraction(self) -> float:
        return sum(self.mask) / len(self.results) if self.results else 0.0

    @property
    def failed(self) -> list[RolloutResult]:
        return [r for r in self.results if r.status != "completed"]


def group_results(results: Iterable[RolloutResult]) -> list[Group]:
    """Group by ``group_id`` (first-seen order), members sorted by sample index."""
    groups: dict[str, Group] = {}
    for r in results:
        key = r.group_id or r.task_id
        if key not in groups:
            groups[key] = Group(key, r.task_id, [])
        groups[key].results.append(r)
    for g in groups.values():
        g.results.sort(key=lambda r: r.sample_index)
    return list(groups.values())


def apply_policy(groups: list[Group], policy: GroupPolicy) -> list[Group]:
    """Mark groups dropped per the policy (retries already done by the caller); returns the same groups."""
    for g in groups:
        if policy.on_failure == "drop" and g.failed:
            g.dropped, g.drop_reason = True, f"{len(g.failed)} of {len(g.results)} members failed"
        elif g.success_fraction < policy.min_success_fraction:
            g.dropped = True
            g.drop_reason = (f"success fraction {g.success_fraction:.2f} < min_success_fraction "
                             f"{policy.min_success_fraction}")
    return groups


def failure_counts(results: Iterable[RolloutResult]) -> dict[str, int]:
    """Failed (infrastructure) results by exit reason."""
    return dict(Counter(r.exit_reason.value for r in results if r.status != "completed"))


@dataclass
class Batch:
    """What ``RolloutFarm.generate`` returns: kept groups (in task order), dropped ones, and the accounting."""

    groups: list[Group]
    dropped: list[Group] = field(default_factory=list)
    not_started: list[tuple[str, int]] = field(default_factory=list)
    """(task id, sample) pairs never started: the token budget ran out first."""
    wall_seconds: float = 0.0
    tokens: int = 0
    stale: int = 0
    """Members whose oldest turn was more than ``max_staleness`` versions behind (masked after any re-run)."""
    rerun: int = 0
    """Members run again because they were stale (``on_stale="rerun"``)."""

    @property
    def results(self) -> list[RolloutResult]:
        return [r for g in (*self.groups, *self.dropped) for r in g.results]

    @property
    def rewards(self) -> list[list[float]]:
        return [g.rewards for g in self.groups]

    @property
    def masks(self) -> list[list[bool]]:
        return [g.mask for g in self.groups]

    @property
    def failed(self) -> int:
        return sum(r.status != "completed" for r in self.results)

    @property
    def failures(self) -> dict[str, int]:
        """Failed results by exit reason (``worker_died``, ``runtime_error``, ``deadline_exceeded``, ...)."""
        return failure_counts(self.results)

    def versions(self) -> dict[str, int]:
        """Completion tokens per policy version over the members a trainer gets (usable ones: not failed, not
        stale); a turn sampled before any version was set counts under ``"none"``."""
        counts: Counter[str] = Counter()
        for group in self.groups:
            for result, usable in zip(group.results, group.mask):
                if usable:
                    for step in result.trajectory.steps:
                        ids = step.completion_token_ids
                        counts[str(step.policy_version) if step.policy_version is not None else "none"] += \
                            len(ids) if ids is not None else step.usage.completion_tokens
        return dict(sorted(counts.items()))

    def segments(self, on_break: str = "split") -> list[list[list[Any]]]:
        """Per group, per member: the member's trainer samples (``rollout.train.tokens.Segment``: prompt ids, response
        ids, loss mask, logprobs), cut where its token stream breaks (``on_break="mask"``: kept, mask 0)."""
        return [[segments(r.trajectory.steps, on_break) for r in g.results] for g in self.groups]

    def samples(self, on_break: str = "split") -> list[Any]:
        """The batch as trainer samples (``rollout.train.batch.TrainerSample``): per completed member and token
        segment, prompt ids, response ids, loss mask, logprobs, per-token policy versions, reward, group stats."""
        return trainer_samples(self.groups, on_break)

    def padded(self, pad_id: int = 0, on_break: str = "split", **limits: Any) -> dict[str, Any]:
        """``samples()`` as rectangular numpy arrays (``rollout.train.batch.padded``)."""
        return padded(self.samples(on_break), pad_id, **limits)

    def describe(self) -> str:
        total = len(self.results)
        why = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "none"
        text = (f"{total} rollouts in {len(self.groups)} groups ({len(self.dropped)} dropped); "
                f"failed {self.failed} ({why}); tokens {self.tokens}; {self.wall_seconds:.1f}s")
        if self.not_started:
            text += f"; {len(self.not_started)} not started (token budget)"
        if self.stale or self.rerun:
            text += f"; stale {self.stale} masked, {self.rerun} re-run"
        return text
