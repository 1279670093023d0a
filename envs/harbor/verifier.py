"""HarborVerifier: a Harbor task's tests, run under the reward contract (``envs.harbor.grading``) in the rollout's
environment (or a fresh one, ``environment_mode = "separate"``), and the rewards kept whole.

The scalar the trainer sees is ``reward_key`` of the rewards (default ``reward``, Harbor's one-number convention);
the whole table is in the reward's details (``rewards``), with the file it came from, the test script's output and,
for a multi-step task, every step's record. Multi-step rewards aggregate as the task says: ``mean`` (each key's
mean over the steps graded, a key a step lacks counting 0) or ``final`` (the last graded step's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from envs.harbor.env import HarborEnvironment
from rollout.config.load import StrictModel, coerce
from rollout.errors import VerifierError
from rollout.records import Reward, RolloutResult, Task


class HarborVerifierConfig(StrictModel):
    type: str = "harbor"
    reward_key: str = Field("reward", min_length=1)
    """The key of the rewards the trainer sees as the reward (all keys are kept in the details)."""
    timeout: float | None = Field(None, gt=0)
    """Seconds the tests may run; none: the task's ``verifier.timeout_sec``."""


class HarborVerifier:
    def __init__(self, config: HarborVerifierConfig | Mapping[str, Any] | None = None, *, env: Any = None, **_: Any):
        self.config = coerce(HarborVerifierConfig, config, prefix="verifier")
        self.env = env

    @classmethod
    def from_config(cls, config: HarborVerifierConfig | Mapping[str, Any], **deps: Any) -> HarborVerifier:
        return cls(config, **deps)

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        env = self.env
        if not isinstance(env, HarborEnvironment) or env.task_config is None:
            raise VerifierError("the harbor verifier grades a harbor environment's container (environment.type "
                                "harbor)", retryable=False)
        records = list(env.stage_rewards)
        if not env.graded_all:
            records.append(await env.grade_step(self.config.timeout))
        strategy = env.task_config.multi_step_reward_strategy
        rewards = aggregate([r["rewards"] for r in records], strategy)
        key = self.config.reward_key
        if key not in rewards:
            raise VerifierError(f"the rewards have no {key!r} (they have {', '.join(sorted(rewards))}): set "
                                "verifier.reward_key", retryable=False)
        last = records[-1]
        details: dict[str, Any] = {"rewards": rewards, "reward_key": key, "reward_file": last["reward_file"],
                                   "test_output": last["output"], "environment_mode": last["mode"]}
        if env.task_config.steps:
            details.update(steps=records, strategy=strategy, steps_run=len(records),
                           steps_total=len(env.task_config.steps))
        return Reward(value=rewards[key], details=details)


def aggregate(per_step: list[dict[str, float]], strategy: str) -> dict[str, float]:
    if len(per_step) == 1 or strategy == "final":
        return dict(per_step[-1])
    keys = sorted({key for rewards in per_step for key in rewards})
    return {key: sum(r.get(key, 0.0) for r in per_step) / len(per_step) for key in keys}
