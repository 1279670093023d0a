"""Compose: validate every component section of a RunConfig, then build the parts of each rollout.

All validation happens in ``Composer.__init__``, before any work starts, so a bad config fails
with one line naming the field. Building per rollout is cheap: agents are shared (stateless),
environments, runtimes and verifiers are fresh per rollout.
"""

from __future__ import annotations

import functools
import inspect
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from cluster.config.run_config import RunConfig
from cluster.gateway.sandbox import INSIDE, SandboxGateway, gateway_dir
from cluster.names import AGENTS, ENVIRONMENTS, MODELS, RUNTIMES, VERIFIERS, with_policy_path
from cluster.serving.kinds import app_for
from rollout.config.components import (
    BindsPaths,
    ChecksRows,
    EndpointModelConfig,
    FromConfig,
    PicksImages,
    RunsContainers,
    RunsImages,
)
from rollout.config.load import deep_merge, validate
from rollout.errors import ConfigError
from rollout.protocols import Agent, Environment, HasLimits, Model, Runtime, TakesGateway, Verifier
from rollout.records import RequestMeta, Task
from rollout.registry import Registry
from rollout.termination import Limits


@dataclass
class Component:
    cls: type
    config: BaseModel | dict[str, Any]
    """The section validated by the class's ``<Name>Config``; the section as it is for a class without one."""


@dataclass
class Profile:
    agent: Agent
    limits: Limits
    environment: Component
    runtime: Component | None
    verifier: Component | None


@dataclass
class RolloutParts:
    agent: Agent
    env: Environment
    verifier: Verifier | None
    limits: Limits


def component(registry: Registry, section: dict[str, Any] | None, field: str) -> Component | None:
    """The class a section's ``type`` names and the section validated by that class's ``<Name>Config``."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"must be a mapping, got {type(section).__name__}", field)
    if "type" not in section:
        raise ConfigError(f"missing; choose one of {', '.join(registry.names())}", f"{field}.type")
    cls = registry.load(str(section["type"]), field=f"{field}.type")
    config_cls = getattr(sys.modules[cls.__module__], f"{cls.__name__}Config", None)
    if isinstance(config_cls, type) and issubclass(config_cls, BaseModel):
        return Component(cls, validate(config_cls, section, prefix=field))
    return Component(cls, dict(section))


def build(comp: Component, **deps: Any) -> Any:
    """``cls.from_config(config, **deps)`` (or ``cls(config, **deps)``), passing only the deps it accepts."""
    factory = _factory(comp.cls)
    params, takes_all = _accepts(factory)
    return factory(comp.config, **{k: v for k, v in deps.items() if takes_all or k in params})


def _factory(cls: type) -> Callable[..., Any]:
    """What builds a component of ``cls`` from its section: its ``from_config`` (``FromConfig``), else the class."""
    return cls.from_config if isinstance(cls, type) and issubclass(cls, FromConfig) else cls


@functools.lru_cache(maxsize=256)
def _accepts(factory: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """The keyword names ``factory`` takes and whether it takes ``**kwargs`` (``inspect.signature`` costs
    about 30 µs, and every rollout builds its environment and runtime)."""
    params = inspect.signature(factory).parameters
    return frozenset(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def model_is_scripted(config: RunConfig) -> bool:
    """Scripted outputs, in process or served by our own scripted server or Serve app: safe to run on the host."""
    scripted_app = config.serve is not None and app_for(config.serve).scripted
    return config.model.get("type") == "scripted" or scripted_app


class Composer:
    def __init__(self, config: RunConfig, tasks: list[Task] = ()):
        self.config = config
        self.model_component = component(MODELS, with_policy_path(config.model, "model.policy"), "model")
        serve, model_config = config.deployed, self.model_component.config
        overrides: dict[str, Any] = {}
        if serve is not None and isinstance(model_config, EndpointModelConfig):  # what the model tier's kind sets
            overrides = app_for(serve).model_overrides(serve, model_config)
        elif config.played_here is not None and isinstance(model_config, EndpointModelConfig):
            overrides = {"api_key": config.played_here.key()}  # the run's own server needs it beyond loopback
        if overrides:
            self.model_component = Component(self.model_component.cls, model_config.model_copy(update=overrides))
        self.trusted_model = model_is_scripted(config)
        self.gateways: list[SandboxGateway] = []
        """The model gateways this run opens for agents that need one (``TakesGateway``), one per profile."""
        self._gateway_dir = gateway_dir(secrets.token_hex(8))
        self.profiles: dict[str | None, Profile] = {None: self._profile(None)}
        for name in config.profiles:
            self.profiles[name] = self._profile(name)
        self.tasks: dict[str, Task] = {}
        self.bind_tasks(tasks)

    def __getstate__(self) -> dict[str, Any]:
        """Shipped to workers without the dataset: each binds the tasks it is handed (``bind_tasks``)."""
        return {**self.__dict__, "tasks": {}}

    async def aclose(self) -> None:
        """Stop this process's gateway servers (their sockets removed) and their upstream sessions."""
        for gateway in self.gateways:
            await gateway.aclose()

    def container_engines(self) -> set[str]:
        """Container engines the profiles' runtimes use (their leftovers are reaped at a run's start)."""
        engines = set()
        for profile in self.profiles.values():
            if profile.runtime is not None and isinstance(profile.runtime.config, RunsContainers):
                engines.add(profile.runtime.config.container_engine)
        return engines

    def image_of(self, task: Task) -> str | None:
        """The image ``task``'s container runs from: its own when its environment picks one per task (``PicksImages``:
        SWE), else its runtime's; None for a runtime without images."""
        profile = self.profiles.get(task.data.get("profile"))
        runtime = profile.runtime.config if profile is not None and profile.runtime is not None else None
        if not isinstance(runtime, RunsImages):
            return None
        if issubclass(profile.environment.cls, PicksImages):
            return profile.environment.cls.image_for(task)
        return runtime.image

    def row_check(self) -> Callable[[Task], None] | None:
        """The dataset row checks of every environment in use (``ChecksRows``), or None."""
        checks: list[Callable[[Task], None]] = []
        for profile in self.profiles.values():
            env_cls = profile.environment.cls
            if issubclass(env_cls, ChecksRows) and env_cls.check_row not in checks:
                checks.append(env_cls.check_row)
        if not checks:
            return None

        def check_all(task: Task) -> None:
            for check in checks:
                check(task)

        return check_all

    def bind_tasks(self, tasks: list[Task]) -> None:
        """The dataset this run uses: profile names checked, tasks visible to in-process scripted models."""
        for task in tasks:
            name = task.data.get("profile")
            if name is not None and name not in self.profiles:
                raise ConfigError(f"task {task.task_id!r} names unknown profile {name!r}", "dataset")
        self.tasks.update({t.task_id: t for t in tasks})

    def _profile(self, name: str | None) -> Profile:
        cfg = self.config
        over = cfg.profiles[name] if name is not None else None
        prefix = f"profiles.{name}." if name is not None else ""

        def section(key: str) -> dict[str, Any] | None:
            base = getattr(cfg, key)
            extra = getattr(over, key) if over is not None else None
            if extra is None:
                return base
            # a different type replaces the section; the same type overrides its keys
            replaces = base is None or extra.get("type", base.get("type")) != base.get("type")
            return extra if replaces else deep_merge(base, extra)

        parts, problems = {}, []
        for key, registry in (("agent", AGENTS), ("environment", ENVIRONMENTS), ("runtime", RUNTIMES),
                              ("verifier", VERIFIERS)):
            try:  # every section checked, so one run of the command shows every problem
                parts[key] = component(registry, section(key), prefix + key)
            except ConfigError as exc:
                problems.append(exc)
        if problems:
            raise ConfigError("\n".join([problems[0].message, *(str(e) for e in problems[1:])]), problems[0].field)
        agent_obj = build(parts["agent"])
        limits = agent_obj.limits() if isinstance(agent_obj, HasLimits) else Limits()
        if isinstance(agent_obj, TakesGateway) and agent_obj.needs_gateway():
            parts["runtime"] = self._open_gateway(agent_obj, parts["runtime"], prefix + "agent")
        return Profile(agent=agent_obj, limits=limits, environment=parts["environment"], runtime=parts["runtime"],
                       verifier=parts["verifier"])

    def _open_gateway(self, agent: TakesGateway, runtime: Component | None, field: str) -> Component | None:
        """Bind a gateway in front of the run's model to ``agent``; the runtime section, its sandboxes binding the
        gateway's directory (``BindsPaths``; a runtime on the host sees it as it is)."""
        if not isinstance(self.model_component.config, EndpointModelConfig):
            raise ConfigError("an agent that speaks OpenAI through the run's gateway needs the model at an HTTP "
                              "address: a `serve` section (scripted or vllm), or `model: {type: openai, base_url}`; "
                              "or name a gateway of your own with gateway_url", field)
        inside = None
        if runtime is not None and isinstance(runtime.config, BindsPaths):
            config = runtime.config
            runtime = Component(runtime.cls, config.model_copy(update={
                "binds": [*config.binds, f"{self._gateway_dir}:{INSIDE}:ro"]}))
            inside = INSIDE
        gateway = SandboxGateway(self._gateway_dir, inside, self.model_url(),
                                 api_key=self.model_component.config.api_key)
        agent.bind_gateway(gateway)
        self.gateways.append(gateway)
        return runtime

    def build_model(self, base_url: str | None = None) -> Model:
        for gateway in self.gateways:  # the gateway's upstream is the model this builds
            gateway.set_upstream(self.model_url(base_url))
        comp = self.model_component
        config = comp.config
        if base_url is not None and isinstance(config, EndpointModelConfig):
            config = config.model_copy(update={"base_url": base_url})
            if self.config.deployed is not None:  # the run's own Serve app: its kind may skip the HTTP proxy
                inside = app_for(self.config.deployed).inside_model(self.config.deployed, Component(comp.cls, config))
                if inside is not None:
                    return inside
        return build(Component(comp.cls, config), tasks=self.tasks)

    def model_url(self, base_url: str | None = None) -> str | None:
        """The URL ``build_model(base_url)`` talks to; None for a model without one (scripted, in process)."""
        config = self.model_component.config
        if base_url is None and isinstance(config, EndpointModelConfig):
            return config.base_url
        return base_url

    def parts(self, task: Task, meta: RequestMeta | None = None) -> RolloutParts:
        profile = self.profiles[task.data.get("profile")]
        env = self._environment(profile, meta or RequestMeta(task_id=task.task_id))
        verifier = None
        if profile.verifier is not None:
            verifier = build(profile.verifier, env=env)
        elif isinstance(env, Verifier):  # an environment that grades itself
            verifier = env
        return RolloutParts(profile.agent, env, verifier, profile.limits)

    def _environment(self, profile: Profile, meta: RequestMeta) -> Environment:
        if profile.runtime is None:
            return build(profile.environment)
        runtime_builder = self._runtime_builder(profile.runtime, meta)
        # an environment takes a runtime, or a builder when it picks the image per task (SWE)
        wants_runtime = "runtime" in _accepts(_factory(profile.environment.cls))[0]
        return build(profile.environment, runtime=runtime_builder() if wants_runtime else None,
                     runtime_builder=runtime_builder)

    def _runtime_builder(self, comp: Component, meta: RequestMeta) -> Callable[..., Runtime]:
        """``builder(**overrides)``: a new runtime of this section, with overrides of its config fields
        (``image=``, ``workdir=``) where it has them. Run and rollout ids label containers, so a reaper
        can find what a crash left behind."""

        def builder(**overrides: Any) -> Runtime:
            config = comp.config
            fields = type(config).model_fields if isinstance(config, BaseModel) else {}
            known = {k: v for k, v in overrides.items() if k in fields}
            if known:
                config = config.model_copy(update=known)
            return build(Component(comp.cls, config), trusted_model=self.trusted_model, run_id=meta.run_id,
                         rollout_id=meta.rollout_id)

        return builder
