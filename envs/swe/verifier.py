"""SweVerifier: the swe verifier of a run; grades a rollout's patch in a fresh runtime with swe_grading.grade."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from envs.swe.grading.grade import grade
from rollout.config.load import StrictModel, coerce
from rollout.errors import VerifierError
from rollout.protocols import GradingSource, Runtime
from rollout.records import Reward, RolloutResult, Task


def patch_of(result: RolloutResult) -> str | None:
    """The model's patch: what the rollout submitted (the Mini-SWE agent submits ``git diff`` output)."""
    return result.submission


class SweVerifierConfig(StrictModel):
    type: str = "swe"
    """Registry short name of this verifier."""
    eval_timeout: float = Field(1800.0, gt=0)
    """Seconds the tests may run; past it the instance is graded unresolved (timed out)."""
    setup_timeout: float = Field(600.0, gt=0)
    """Seconds each preparation command (patch application, test reset) may take."""
    repo_dir: str = "/testbed"
    """The repository in the grading runtime: absolute, or relative to the runtime's workdir ("." for a
    local workspace holding the clone)."""
    max_log_chars: int = Field(200_000, ge=1000)
    """Characters of the test log kept in the reward details (its tail)."""
    strict: bool = False
    """Score 0 (with the reason) any patch that touches test files (the test patch's, those of FAIL_TO_PASS /
    PASS_TO_PASS ids, conftest.py, test_*.py / *_test.py, anything under tests/, test/ or testing/) or pytest
    configuration (pytest.ini, tox.ini, the pytest section of setup.cfg or pyproject.toml)."""


class SweVerifier:
    """Grades a rollout's patch in a fresh runtime per task from ``runtime_factory(task)``; the reward is
    1.0 when resolved, the details are the Grade. ``patch_of`` picks the patch from a result."""

    def __init__(self, config: SweVerifierConfig | Mapping[str, Any] | None = None, *,
                 runtime_factory: Callable[[Task], Runtime] | None = None,
                 patch_of: Callable[[RolloutResult], str | None] = patch_of, log: Callable[[str], Any] | None = None,
                 env: Any = None, **_: Any):
        self.config = coerce(SweVerifierConfig, config, prefix="verifier")
        self.runtime_factory = runtime_factory
        self.patch_of = patch_of
        self.log = log
        self.env = env
        """The rollout's environment; when it is a ``GradingSource`` (SweEnvironment), it gives the patch, the
        repository's place and a fresh runtime of the rollout's kind."""

    @classmethod
    def from_config(cls, config: SweVerifierConfig | Mapping[str, Any], **deps: Any) -> SweVerifier:
        return cls(config, **deps)

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        cfg = self.config
        repo_dir, source = cfg.repo_dir, "submission"
        if isinstance(self.env, GradingSource):
            env = self.env
            patch, source = await env.final_patch(self.patch_of(result))
            repo_dir = env.repo_dir_for(task)

            def fresh() -> Runtime:
                return env.fresh_runtime(task)  # never the agent's runtime
        elif self.runtime_factory is not None:
            patch, factory = self.patch_of(result), self.runtime_factory

            def fresh() -> Runtime:
                return factory(task)
        else:
            raise VerifierError("the swe verifier has no runtime to grade in", retryable=False)
        graded = await grade({"instance_id": task.task_id, **task.data}, patch, fresh,
                             eval_timeout=cfg.eval_timeout, repo_dir=repo_dir, log=self.log,
                             setup_timeout=cfg.setup_timeout, max_log_chars=cfg.max_log_chars, strict=cfg.strict)
        details = graded.model_dump()
        details["patch_source"] = source
        details["model_patch"] = patch
        return Reward(value=graded.reward, details=details)
