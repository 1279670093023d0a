"""What a backend's workers build rollouts from (the ``WorkerSource`` seam): ``ConfigSource``, a run config's
``Composer`` (validated once by the driver, shipped to the workers as is), or ``ObjectSource``, the objects a trainer
handed to ``RolloutFarm`` (shipped by pickling)."""

from __future__ import annotations

from typing import Any, Callable

from cluster.compose import Composer, RolloutParts
from rollout.protocols import Environment, HasLimits, Model, Verifier
from rollout.records import RequestMeta, Task
from rollout.termination import Limits


class ConfigSource:
    """Parts from a run config, validated once by the driver: its ``Composer`` is shipped as is (without the
    dataset: a worker binds the tasks it is handed)."""

    def __init__(self, composer: Composer, base_url: str | None = None):
        self.composer, self.base_url = composer, base_url
        self._bound: dict[str, int] = {}
        """Rollouts running per bound task id (a task stays bound while any of its samples runs)."""

    def build_model(self) -> Model:
        return self.composer.build_model(self.base_url)

    @property
    def model_url(self) -> str | None:
        """Where the model built now sends its calls (recorded on each result)."""
        return self.composer.model_url(self.base_url)

    def parts(self, task: Task, meta: RequestMeta) -> RolloutParts:
        self.composer.bind_tasks([task])  # in-process scripted models look tasks up by id
        self._bound[task.task_id] = self._bound.get(task.task_id, 0) + 1
        try:
            return self.composer.parts(task, meta)
        except BaseException:
            self.release(task)
            raise

    def release(self, task: Task) -> None:
        """The rollout ``parts`` was for has ended: its task is unbound once none of its samples runs (bound
        for good, every task a worker ran stayed in memory: ~1.5 KB a rollout over a long run)."""
        left = self._bound.pop(task.task_id, 1) - 1
        if left > 0:
            self._bound[task.task_id] = left
        else:
            self.composer.tasks.pop(task.task_id, None)

    async def aclose(self) -> None:
        """Stop what the composer opened in this process (the run's gateway for an outside agent)."""
        await self.composer.aclose()


class ObjectSource:
    """Parts from objects: a model, an agent, and factories ``env_factory(task, meta)`` /
    ``verifier_factory(task, env)`` (a fresh environment per rollout). They must pickle (Ray ships them)."""

    def __init__(self, model: Model | Callable[[], Model], agent: Any,
                 env_factory: Callable[[Task, RequestMeta], Environment],
                 verifier_factory: Callable[[Task, Environment], Verifier | None] | None = None,
                 limits: Limits | None = None):
        self.model, self.agent = model, agent
        self.env_factory, self.verifier_factory = env_factory, verifier_factory
        self.limits = limits

    model_url = None
    """The trainer's own model object: the farm cannot tell where it sends its calls."""
    base_url = None
    """Never used: the trainer's model is an object, not a URL (a served model's URL is set here and ignored)."""

    def build_model(self) -> Model:
        is_model = isinstance(self.model, Model) and not isinstance(self.model, type)  # a class is a factory
        return self.model if is_model else self.model()

    def parts(self, task: Task, meta: RequestMeta) -> RolloutParts:
        env = self.env_factory(task, meta)
        verifier = self.verifier_factory(task, env) if self.verifier_factory is not None else None
        if verifier is None and isinstance(env, Verifier):  # an environment that grades itself
            verifier = env
        limits = self.limits or (self.agent.limits() if isinstance(self.agent, HasLimits) else Limits())
        return RolloutParts(self.agent, env, verifier, limits)

    def release(self, task: Task) -> None:
        """Nothing to let go of once a rollout ends."""

    async def aclose(self) -> None:
        """Nothing opened here: the trainer's objects are the trainer's."""


RolloutSource = ConfigSource | ObjectSource
"""Either source: what a worker is built over."""
