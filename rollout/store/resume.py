"""Resume planning: from the results already on disk, what is done, what failed for good, what runs next.

Each (task_id, sample_index) is a *key*; the last result line for a key is the one that
counts. Attempt numbers persist across resumes: a key whose latest attempt failed on
infrastructure runs again as ``previous + 1`` until ``max_attempts`` (unless its error said
``retryable: false``), and after that only with ``retry_infra`` (which grants it a fresh budget
of ``max_attempts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Sequence

from rollout.records import AttemptRecord, RolloutResult, Task

Key = tuple[str, int]


def latest_per_key(results: Iterable[RolloutResult]) -> list[RolloutResult]:
    """One result per (task_id, sample_index): the last one given, in first-seen key order."""
    latest: dict[Key, RolloutResult] = {}
    for r in results:
        latest[(r.task_id, r.sample_index)] = r
    return list(latest.values())


def attempt_record(result: RolloutResult) -> AttemptRecord:
    """The attempt-history entry of one finished attempt."""
    return AttemptRecord(
        attempt=result.attempt,
        status=result.status,
        exit_reason=result.exit_reason,
        error=result.error,
        seconds=result.timings.get("total", result.timings.get("wall", 0.0)),
        node_id=result.node_id,
    )


def can_retry(result: RolloutResult) -> bool:
    """An infrastructure failure another attempt could change (its error did not say ``retryable: false``)."""
    return result.status != "completed" and (result.error is None or result.error.retryable)


class Planned(NamedTuple):
    task: Task
    sample_index: int
    attempt: int


@dataclass
class Plan:
    """What a (re)started run has to do. ``todo`` holds ``(task, sample_index, attempt)``.

    A new result carries its history: ``plan.attempt_history(t, s) + [attempt_record(result)]``.
    """

    max_attempts: int
    todo: list[Planned] = field(default_factory=list)
    done_count: int = 0
    final_failed_count: int = 0
    history: dict[Key, list[AttemptRecord]] = field(default_factory=dict)
    limits: dict[Key, int] = field(default_factory=dict)

    def attempt_history(self, task_id: str, sample_index: int) -> list[AttemptRecord]:
        """Earlier attempts of this key, oldest first (a copy)."""
        return list(self.history.get((task_id, sample_index), []))

    def attempt_limit(self, task_id: str, sample_index: int) -> int:
        """Highest attempt number allowed for this key: ``max_attempts``, raised for keys re-queued by retry_infra."""
        return self.limits.get((task_id, sample_index), self.max_attempts)

    def describe(self) -> str:
        total = len(self.todo) + self.done_count + self.final_failed_count
        return (
            f"{total} rollouts: {self.done_count} done, {self.final_failed_count} failed for good "
            f"(infrastructure), {len(self.todo)} to run"
        )


def plan_resume(
    results: Sequence[RolloutResult],
    tasks: Iterable[Task],
    samples_per_task: int,
    max_attempts: int,
    retry_infra: bool = False,
) -> Plan:
    """Sort every (task, sample) into done, failed for good, or to run with its next attempt number."""
    history = attempt_histories(results)
    latest = {(r.task_id, r.sample_index): r for r in results}
    plan = Plan(max_attempts, history=history)
    for task in tasks:
        for sample in range(samples_per_task):
            key = (task.task_id, sample)
            last = latest.get(key)
            if last is None:
                plan.todo.append(Planned(task, sample, 1))
            elif last.status == "completed":
                plan.done_count += 1
            else:
                tried = max(a.attempt for a in history[key])
                if tried < max_attempts and can_retry(last):
                    plan.todo.append(Planned(task, sample, tried + 1))
                elif retry_infra:
                    plan.todo.append(Planned(task, sample, tried + 1))
                    plan.limits[key] = tried + max_attempts
                else:
                    plan.final_failed_count += 1
    return plan


def attempt_histories(results: Iterable[RolloutResult]) -> dict[Key, list[AttemptRecord]]:
    """Per key, every attempt seen (as a line, or in a line's ``attempts``); a line beats a copy."""
    results = list(results)
    merged: dict[Key, dict[int, AttemptRecord]] = {}
    for r in results:
        seen = merged.setdefault((r.task_id, r.sample_index), {})
        for rec in r.attempts:
            seen.setdefault(rec.attempt, rec)
    for r in results:
        merged[(r.task_id, r.sample_index)][r.attempt] = attempt_record(r)
    return {key: [seen[a] for a in sorted(seen)] for key, seen in merged.items()}
