"""ToolEnvironment: tools from a registry, run in order each round, with an optional reward function.

It is also a Verifier: with a reward function, ``verify`` scores the finished rollout.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from rollout.config.load import StrictModel
from rollout.protocols import EnvReset, ToolExecutor
from rollout.records import Action, Observation, Reward, RolloutResult, Task
from rollout.registry import Registry

RewardFn = Callable[[Task, RolloutResult], Any]
"""Returns a float, a ``Reward``, or ``(value, details)``; may be async."""

FACTORIES = Registry("tools", {})


class ToolEnvironmentConfig(StrictModel):
    type: str = "tool"
    tools: str
    """Dotted path of a factory ``(task) -> ToolExecutor`` (e.g. an ``agents.tools.ToolRegistry``)."""
    reward: str | None = None
    """Dotted path of a reward function ``(task, result) -> float | Reward``; none: reward 0."""


class ToolEnvironment:
    def __init__(
        self,
        tools: ToolExecutor | Callable[[Task], ToolExecutor],
        reward_fn: RewardFn | None = None,
    ):
        self._tools_or_factory = tools
        self.tools: ToolExecutor | None = tools if isinstance(tools, ToolExecutor) else None
        self.reward_fn = reward_fn

    @classmethod
    def from_config(cls, config: ToolEnvironmentConfig) -> "ToolEnvironment":
        factory = FACTORIES.load(config.tools, field="environment.tools")
        reward = FACTORIES.load(config.reward, field="environment.reward") if config.reward else None
        return cls(factory, reward)

    async def reset(self, task: Task) -> EnvReset:
        if not isinstance(self._tools_or_factory, ToolExecutor):  # a factory: fresh tools per task
            self.tools = self._tools_or_factory(task)
        return EnvReset(tools=self.tools.schemas())

    async def step(self, actions: list[Action]) -> list[Observation]:
        # Sequential on purpose: a later call of the same round may depend on an earlier one's effect.
        return [await self.tools.execute(action) for action in actions]

    async def close(self) -> None:
        return None

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        if self.reward_fn is None:
            return Reward(value=0.0, details={"reason": "no reward function"})
        value = self.reward_fn(task, result)
        if inspect.isawaitable(value):
            value = await value
        return as_reward(value)


def as_reward(value: Any) -> Reward:
    if isinstance(value, Reward):
        return value
    if isinstance(value, tuple):
        return Reward(value=float(value[0]), details=dict(value[1]))
    return Reward(value=float(value))
