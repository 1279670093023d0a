"""Verifiers for simple tasks: a check command run in the rollout's workspace, and answer matching."""

from __future__ import annotations

import re
from typing import Literal

from rollout.config.load import StrictModel
from rollout.errors import VerifierError
from rollout.records import Reward, RolloutResult, Task


class CheckCommandVerifierConfig(StrictModel):
    type: str = "check_command"
    timeout: float = 60.0
    """Seconds the check may take."""


class CheckCommandVerifier:
    """Runs ``task.data["check"]`` in the environment's runtime before it closes: exit 0 pays 1.0."""

    def __init__(self, config: CheckCommandVerifierConfig | None = None, env=None):
        self.config = config or CheckCommandVerifierConfig()
        self.env = env

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        check = task.data.get("check")
        if not check:
            raise VerifierError(f"task {task.task_id} has no data.check command", retryable=False)
        out = await self.env.runtime.exec(check, timeout=self.config.timeout)
        passed = out.returncode == 0 and not out.timed_out
        return Reward(
            value=1.0 if passed else 0.0,
            details={"check": check, "returncode": out.returncode, "timed_out": out.timed_out,
                     "output": out.output[-2000:]},
        )


class AnswerMatchVerifierConfig(StrictModel):
    type: str = "answer_match"
    mode: Literal["contains", "exact"] = "contains"
    """``contains`` (case-insensitive substring of the final reply) or ``exact`` (after trimming)."""


class AnswerMatchVerifier:
    """Compares the final reply (the submission) with ``task.data["answer"]``."""

    def __init__(self, config: AnswerMatchVerifierConfig | None = None):
        self.config = config or AnswerMatchVerifierConfig()

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        expected = task.data.get("answer")
        if expected is None:
            raise VerifierError(f"task {task.task_id} has no data.answer", retryable=False)
        got = result.submission or ""
        if self.config.mode == "exact":
            ok = got.strip() == str(expected).strip()
        else:
            ok = re.sub(r"\s+", " ", str(expected)).lower() in re.sub(r"\s+", " ", got).lower()
        return Reward(value=1.0 if ok else 0.0, details={"expected": expected, "got": got[-500:]})


class EnvRewardVerifierConfig(StrictModel):
    type: str = "env_reward"


class EnvRewardVerifier:
    """The reward is what the environment handed out along the way (a step environment's sum)."""

    def __init__(self, config: EnvRewardVerifierConfig | None = None):
        self.config = config or EnvRewardVerifierConfig()

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        return Reward(value=result.trajectory.env_reward, details={"source": "environment rewards"})
