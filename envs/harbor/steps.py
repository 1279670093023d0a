"""The steps of a multi-step Harbor task, in one environment: each step's tests graded when the agent is done with
it, its ``min_reward`` gating the next, the next step's ``workdir/`` and ``setup.sh`` and healthcheck before its
agent runs (with its own user and timeout). The runner moves between them (``rollout.stages``); the verifier
grades the last one and aggregates (``envs.harbor.verifier``)."""

from __future__ import annotations

from typing import Any

from envs.harbor import grading
from envs.runtimes.docker.files import EngineContainer
from rollout.errors import EnvironmentFailure
from rollout.records import Task


def gate_missed(rewards: dict[str, float], gate: float | dict[str, float] | None) -> str | None:
    """Why a step's rewards miss its ``min_reward`` (a number gates ``reward``; a table each key), or None."""
    if gate is None:
        return None
    wanted = {"reward": gate} if isinstance(gate, (int, float)) else gate
    for key, threshold in wanted.items():
        value = rewards.get(key)
        if value is None or value < threshold:
            return f"{key}={value} below min_reward {threshold}"
    return None


class Stages:
    """``HarborEnvironment``'s steps (it sets ``task``, ``task_config``, ``files``, ``workdir``, ``stage``,
    ``stage_rewards`` and gives ``runtime``, ``grade_step`` and ``_healthy``)."""

    task: Task
    task_config: Any
    files: Any
    workdir: str
    stage: int
    stage_rewards: list[dict[str, Any]]
    runtime: EngineContainer

    async def next_stage(self) -> Task | None:
        """Grade the step just done; the next step's task, or None (the last step: the verifier grades it; or
        this step's ``min_reward`` not met: the rest are skipped, as Harbor does)."""
        cfg = self.task_config
        if not cfg.steps or self.stage >= len(cfg.steps) - 1:
            return None
        record = await self.grade_step()
        self.stage_rewards.append(record)
        missed = gate_missed(record["rewards"], cfg.steps[self.stage].min_reward)
        if missed:
            record["gated"] = missed
            return None
        self.stage += 1
        step = cfg.steps[self.stage]
        if step.agent.user != cfg.steps[self.stage - 1].agent.user:  # the next step's commands run as its user
            self.runtime.config = self.runtime.config.model_copy(update={"user": step.agent.user})
        await self._step_setup(step.name)
        await self._healthy(step.healthcheck)
        data = {**self.task.data, "time_limit": step.agent.timeout_sec}
        return self.task.model_copy(update={"prompt": self.files.text(f"steps/{step.name}/instruction.md"),
                                            "data": data})

    async def _step_setup(self, name: str) -> None:
        """A step's ``workdir/`` copied into the working directory, and its ``setup.sh`` run there."""
        files = self.files.under(f"steps/{name}/workdir")
        if not files:
            return
        await self.runtime.engine_call(grading.put_tree, self.workdir, grading.merged_tests(files, {}, set()))
        if "setup.sh" in files:
            out = await self.runtime.exec("bash setup.sh", timeout=600)
            if out.returncode != 0:
                raise EnvironmentFailure(f"step {name}: setup.sh exited with {out.returncode}: {out.output[-300:]}")

    @property
    def graded_all(self) -> bool:
        """Whether no step is left for the verifier (a gate stopped the task)."""
        return bool(self.stage_rewards) and "gated" in self.stage_rewards[-1]
