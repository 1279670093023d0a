"""HarborEnvironment: a Harbor task's container, driven one shell command per turn (the Mini-SWE bash loop).

At reset the task's image is found or built on this machine (``envs.harbor.images``), and a container of it
starts with what ``task.toml`` asks for: its working directory, variables, CPUs, memory and disk, the agent's
user, and its network (``no-network`` unless the task asks for ``public`` and this environment's ``allow_network``
gives it; ``allowlist`` is refused: the runtime cannot enforce one). Its ``healthcheck`` must pass before the
agent starts. ``/logs/agent`` is there for the agent's logs. Grading is the verifier's (``envs.harbor.verifier``),
through ``grade_step``; multi-step tasks move on with ``next_stage``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from pydantic import Field

from envs.harbor import grading
from envs.harbor.archive import task_files
from envs.harbor.dataset import config_of
from envs.harbor.images import ensure_task_image, image_workdir
from envs.harbor.steps import Stages
from envs.harbor.task_config import Healthcheck, Phase, Step, TaskConfig
from envs.runtimes.docker.files import EngineContainer
from envs.shell_env import ShellEnvironment, ShellEnvironmentConfig
from rollout.config.load import StrictModel
from rollout.errors import ConfigError, EnvironmentFailure, VerifierError
from rollout.protocols import EnvReset, ExecResult, Runtime
from rollout.records import Action, Observation, Task


class HarborEnvironmentConfig(StrictModel):
    type: str = "harbor"
    command_timeout: float = Field(600.0, gt=0)
    """Seconds each of the agent's commands may run."""
    allow_network: bool = False
    """Give a task that asks for ``network_mode = "public"`` the engine's bridge network. Off: such a task is
    refused before the run starts (the farm's default is no network)."""
    env: dict[str, str] = Field(default_factory=lambda: {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"})
    """Variables of every agent command (the task's ``environment.env`` are the container's own)."""


def network_for(config: TaskConfig, phase: Phase, allow_network: bool, where: str) -> str:
    """The runtime's network for a phase: ``none`` or ``bridge``; a ``ConfigError`` when it cannot be given."""
    mode = phase.network_mode or config.network_mode
    if mode == "allowlist":
        raise ConfigError(f"{where} asks for network_mode 'allowlist': this runtime cannot enforce an allowlist",
                          "environment.allow_network")
    if mode == "public" and not allow_network:
        raise ConfigError(f"{where} asks for network_mode 'public': tasks run with no network here unless "
                          "environment.allow_network is true", "environment.allow_network")
    return "bridge" if mode == "public" else "none"


def check_tasks(tasks: list[Task], environment: dict[str, Any] | None) -> None:
    """Before any work: every task's network can be given (``ConfigError`` naming the first that cannot)."""
    allow = bool((environment or {}).get("allow_network", False))
    for task in tasks:
        config = config_of(task)
        for phase, name in ((config.agent, "agent"), (config.verifier, "verifier")):
            network_for(config, phase, allow, f"task {task.task_id} ({name})")


class HarborEnvironment(Stages):
    def __init__(self, config: HarborEnvironmentConfig | None = None, *, runtime_builder: Callable[..., Runtime]):
        self.config = config or HarborEnvironmentConfig()
        self.builder = runtime_builder
        self.shell: ShellEnvironment | None = None
        self.container: EngineContainer | None = None
        """The agent's container, which ``shell`` runs the agent's commands in."""
        self.task: Task | None = None
        self.task_config: TaskConfig | None = None
        self.files: Any = None
        self.image = self.workdir = ""
        self.own_processes = ""
        self.stage = 0
        """The index of the step the agent is on (multi-step tasks)."""
        self.stage_rewards: list[dict[str, Any]] = []

    @staticmethod
    def image_for(task: Task) -> str:
        """The task's image (its ``docker_image``, or the tag its ``environment/`` builds to): a farm sends the task's
        rollouts to a node that already holds or built it (``rollout.config.components.PicksImages``)."""
        return task.data["harbor"]["image"]

    @classmethod
    def from_config(cls, config: HarborEnvironmentConfig, runtime_builder: Callable[..., Runtime],
                    **_: Any) -> "HarborEnvironment":
        return cls(config, runtime_builder=runtime_builder)

    @property
    def runtime(self) -> EngineContainer:
        return self.container

    @property
    def runtime_env(self) -> dict[str, str]:
        return dict(self.config.env)

    def runtime_for(self, phase: Phase, where: str) -> EngineContainer:
        """A new, unstarted container of the task's image for ``phase`` (the agent's, or a separate verifier's)."""
        cfg = self.task_config
        overrides: dict[str, Any] = {"image": self.image, "workdir": self.workdir, "env": dict(cfg.env),
                                     "network": network_for(cfg, phase, self.config.allow_network, where),
                                     "user": phase.user}
        if cfg.cpus:
            overrides["cpus"] = cfg.cpus
        if cfg.memory_mb:
            overrides["memory"] = f"{cfg.memory_mb}m"
        if cfg.storage_mb:
            overrides["disk"] = f"{cfg.storage_mb}m"
        runtime = self.builder(**overrides)
        if not isinstance(runtime, EngineContainer):
            raise EnvironmentFailure(f"Harbor tasks run in containers: runtime {type(runtime).__name__} cannot run "
                                     "the task's image (use runtime.type docker or podman)", retryable=False)
        return runtime

    async def reset(self, task: Task) -> EnvReset:
        if self.shell is not None and self.stage > 0 and self.task is not None and task.task_id == self.task.task_id:
            return EnvReset(info={"image": self.image, "cwd": self.workdir, "harbor_step": self.step_name})
        self.task = task
        harbor = task.data["harbor"]
        self.task_config = cfg = config_of(task)
        self.files = await asyncio.to_thread(task_files, task.data["task_archive"])
        self.image = await asyncio.to_thread(ensure_task_image, harbor, self.files, timeout=cfg.build_timeout_sec)
        self.workdir = cfg.workdir or await asyncio.to_thread(image_workdir, self.image) or "/"
        try:
            runtime = self.runtime_for(cfg.agent, f"task {task.task_id}")
        except ConfigError as exc:
            raise EnvironmentFailure(exc.message, retryable=False) from None
        self.container = runtime
        self.shell = ShellEnvironment(runtime, ShellEnvironmentConfig(command_timeout=self.config.command_timeout,
                                                                      env=self.config.env))
        reset = await self.shell.reset(task)
        self.own_processes = await grading.own_processes(runtime)
        made = await runtime.exec("mkdir -p /logs/agent /logs/verifier && chmod 0777 /logs/agent", timeout=60,
                                  cwd="/", user=grading.ROOT, shell=grading.SHELL)
        if made.returncode != 0:
            raise EnvironmentFailure(f"cannot make /logs/agent: {made.output[-300:]}")
        await self._healthy(cfg.healthcheck)
        reset.info.update({"image": self.image, "cwd": self.workdir, "harbor_steps": len(cfg.steps) or 1})
        return reset

    async def _healthy(self, check: Healthcheck | None) -> None:
        if check is None:
            return
        began, failures = time.monotonic(), 0
        while True:
            out = await self.runtime.exec(check.command, timeout=check.timeout_sec)
            if out.returncode == 0 and not out.timed_out:
                return
            in_grace = time.monotonic() - began < check.start_period_sec
            failures += not in_grace
            if failures >= check.retries:
                raise EnvironmentFailure(f"healthcheck {check.command!r} failed {failures} times: "
                                         f"{out.output[-300:]}")
            await asyncio.sleep(check.start_interval_sec if in_grace else check.interval_sec)

    async def step(self, actions: list[Action]) -> list[Observation]:
        return await self.shell.step(actions)

    async def close(self) -> None:
        if self.shell is not None:
            await self.shell.close()

    # ---- the oracle agent's way in (rollout.protocols.HoldsSolution) -----------------------------

    async def run_reference_solution(self, timeout: float | None = None) -> ExecResult:
        """The task's ``solution/`` (a step's own when it has one) copied to ``/solution`` and ``solve.sh`` run as
        the agent's user, with the solution's variables: what Harbor's oracle agent does."""
        step = self.step_name
        own = self.files.under(f"steps/{step}/solution") if step else {}
        files = own or self.files.under("solution")
        if "solve.sh" not in files:
            raise EnvironmentFailure(f"task {self.task.task_id} has no solution/solve.sh", retryable=False)
        runtime = self.runtime
        await runtime.exec("rm -rf /solution && mkdir -p /solution", timeout=60, cwd="/", user=grading.ROOT,
                           shell=grading.SHELL)
        await runtime.engine_call(grading.put_tree, "/solution", grading.merged_tests(files, {}, set(files)))
        phase = self._current.agent
        return await runtime.exec("bash /solution/solve.sh", timeout=timeout or phase.timeout_sec or 1800,
                                  env=self.task_config.solution_env or None)

    # ---- grading ------------------------------------------------------------------------------------

    @property
    def step_name(self) -> str | None:
        steps = self.task_config.steps if self.task_config else []
        return steps[self.stage].name if steps else None

    @property
    def _current(self) -> Step | TaskConfig:
        """The step the agent is on, or the task itself when it has no steps: either holds an ``agent`` and a
        ``verifier`` phase."""
        cfg = self.task_config
        return cfg.steps[self.stage] if cfg.steps else cfg

    async def grade_step(self, timeout: float | None = None) -> dict[str, Any]:
        """Run the current step's tests under the reward contract (``envs.harbor.grading``); its record:
        ``rewards``, ``reward_file``, ``output`` (the test script's, tail), ``seconds``, ``mode``."""
        phase = self._current.verifier
        step = self.step_name
        own = f"steps/{step}/tests" if step else None
        tests = grading.merged_tests(self.files.under("tests"), self.files.under(own) if own else {},
                                     self.files.executable_under("tests") | self.files.executable_under(own or ""))
        began = time.monotonic()
        target, fresh = self.runtime, None
        if phase.environment_mode == "separate":
            fresh = self.runtime_for(phase, f"task {self.task.task_id} (verifier)")
            await fresh.start()
            target = fresh
        try:
            if fresh is None:
                await grading.kill_leftovers(self.runtime, self.own_processes)
            else:
                await grading.copy_workspace(self.runtime, fresh, self.workdir)
            await grading.fresh_dirs(target)
            await grading.copy_tests(target, tests)
            output, timed_out = await grading.run_test_script(
                target, user=phase.user, env=phase.env, timeout=timeout or phase.timeout_sec or 600.0,
                workdir=self.workdir)
            if timed_out:
                raise VerifierError(f"the tests ran past verifier.timeout_sec ({phase.timeout_sec:g}s): "
                                    f"{output[-300:]}", retryable=False)
            rewards, source = await grading.read_rewards(target)
        finally:
            if fresh is not None:
                await fresh.close()
        return {"step": step, "rewards": rewards, "reward_file": source, "output": output[-4000:],
                "seconds": round(time.monotonic() - began, 3), "mode": phase.environment_mode}
