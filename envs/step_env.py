"""StepEnvironmentAdapter: runs a classic ``reset() -> obs`` / ``step(action) -> (obs, reward, done,
info)`` environment (seed 3's BaseEnvironment, games, simulations) behind the Environment seam.

Rewards handed out by ``step`` are summed into the trajectory; ``done`` ends the episode.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Literal, Protocol, runtime_checkable

from rollout.config.load import StrictModel
from rollout.errors import EnvironmentFailure
from rollout.protocols import EnvReset
from rollout.records import Action, Observation, Task
from rollout.registry import Registry

GAMES = Registry("step environment", {"guess_number": "envs.games:GuessNumber"})


class StepEnv(Protocol):
    """What the adapter drives: ``reset() -> first observation`` and ``step(action) -> (obs, reward, done, info)``,
    each plain or awaitable."""

    def reset(self) -> Any: ...

    def step(self, action: str) -> Any: ...


@runtime_checkable
class ClosesItself(Protocol):
    """An optional ability of a ``StepEnv``: ``close()`` (plain or awaitable), called when the episode's
    environment closes."""

    def close(self) -> Any: ...


class StepEnvironmentAdapterConfig(StrictModel):
    type: str = "step"
    env: str
    """Short name or dotted path of a class/factory ``(task) -> StepEnv``."""
    action_format: Literal["name_args", "json", "raw"] = "name_args"
    """What ``step`` receives: ``"guess 5"``, ``'{"tool": "guess", "parameters": {...}}'``, or the raw text."""


class StepEnvironmentAdapter:
    def __init__(self, factory: Callable[[Task], StepEnv], action_format: str = "name_args"):
        self.factory = factory
        self.action_format = action_format
        self.env: StepEnv | None = None
        self.done = False

    @classmethod
    def from_config(cls, config: StepEnvironmentAdapterConfig) -> "StepEnvironmentAdapter":
        return cls(GAMES.load(config.env, field="environment.env"), config.action_format)

    async def reset(self, task: Task) -> EnvReset:
        self.env = self.factory(task)
        self.done = False
        first = await _maybe_await(self.env.reset())
        return EnvReset(messages=[{"role": "user", "content": str(first)}] if first else [])

    async def step(self, actions: list[Action]) -> list[Observation]:
        out = []
        for action in actions:
            if self.done:
                out.append(Observation(content="The episode is over.", success=False, action_name=action.name,
                                       call_id=action.call_id, done=True))
                continue
            try:
                obs, reward, done, info = await _maybe_await(self.env.step(self.render(action)))
            except Exception as exc:  # noqa: BLE001 - the wrapped environment broke, not the model
                raise EnvironmentFailure(f"{type(self.env).__name__}.step failed: {exc}") from exc
            self.done = bool(done)
            out.append(Observation(content=str(obs), reward=float(reward or 0.0), done=self.done,
                                   action_name=action.name, call_id=action.call_id, info=dict(info or {})))
        return out

    def render(self, action: Action) -> str:
        if self.action_format == "raw" or action.kind == "text":
            return action.raw
        if self.action_format == "json":
            return json.dumps({"tool": action.name, "parameters": action.arguments})
        return " ".join([action.name, *(str(v) for v in action.arguments.values())])

    async def close(self) -> None:
        if isinstance(self.env, ClosesItself):
            await _maybe_await(self.env.close())


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
