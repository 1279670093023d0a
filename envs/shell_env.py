"""ShellEnvironment: Mini-SWE style, one bash command per action, run in a Runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from envs.runtimes.output import elide, output_limit
from rollout.config.load import StrictModel, coerce
from rollout.errors import EnvironmentFailure
from rollout.protocols import EnvReset, ExecResult, HasWorkdir, Runtime
from rollout.records import Action, Observation, Task

_TAIL = 2000
"""Characters of a failed setup command's output quoted in the error."""


class ShellEnvironmentConfig(StrictModel):
    type: str = "shell"
    """Registry short name of this environment."""
    cwd: str | None = None
    """Directory commands run in (relative to the runtime's workdir, or absolute); none: the runtime's default."""
    command_timeout: float = Field(30.0, gt=0)
    """Seconds each command may run before its process group is killed."""
    setup_commands: list[str] = Field(default_factory=list)
    """Commands run in ``cwd`` at reset, in order; any failure is an ``EnvironmentFailure``."""
    setup_from_task: bool = False
    """Also run the task's own ``data.setup`` (a command or a list of them) after ``setup_commands``."""
    setup_timeout: float | None = Field(None, gt=0)
    """Timeout of each setup command; none: ``command_timeout``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every command (e.g. ``PAGER: cat``)."""
    truncated_keep_chars: int = Field(8000, ge=0)
    """Characters kept (first half, last half) of an output the runtime cut at its cap. The observation, and
    so the trajectory, holds that elided form and a note that the command was stopped, never the whole cap."""


class ShellEnvironment:
    """``step`` runs each ``Action(kind="bash", arguments={"command": ...})`` and returns its output.

    A command that fails or times out is an observation with ``success=False``; only a broken
    runtime (``RuntimeFailure``) or a failed setup (``EnvironmentFailure``) raises.
    """

    def __init__(self, runtime: Runtime, config: ShellEnvironmentConfig | Mapping[str, Any] | None = None):
        config = coerce(ShellEnvironmentConfig, config, prefix="environment")
        self.runtime = runtime
        """Kept public: graders run commands in the same runtime after the episode."""
        self.config = config
        self._started = False
        self._closed = False

    @classmethod
    def from_config(cls, config: ShellEnvironmentConfig | Mapping[str, Any], runtime: Runtime) -> "ShellEnvironment":
        return cls(runtime, config)

    @property
    def runtime_env(self) -> dict[str, str]:
        """The variables every command runs with (``env``): an agent's own command in the runtime gets them too."""
        return dict(self.config.env)

    async def reset(self, task: Task) -> EnvReset:
        if not self._started:
            await self.runtime.start()
            self._started = True
        timeout = self.config.setup_timeout or self.config.command_timeout
        commands = list(self.config.setup_commands)
        if self.config.setup_from_task:
            own = task.data.get("setup") or []
            commands += [own] if isinstance(own, str) else list(own)
        for command in commands:
            result = await self._exec(command, timeout)
            if result.returncode != 0 or result.timed_out:
                why = "timed out" if result.timed_out else f"exited with {result.returncode}"
                raise EnvironmentFailure(f"setup command {command!r} {why}: {result.output[-_TAIL:]}")
        cwd = self.config.cwd or (self.runtime.workdir if isinstance(self.runtime, HasWorkdir) else None) or "."
        return EnvReset(info={"cwd": cwd, "runtime": type(self.runtime).__name__})

    async def step(self, actions: list[Action]) -> list[Observation]:
        # In order: a later command may depend on what an earlier one did.
        return [await self._run(action) for action in actions]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.runtime.close()

    async def _run(self, action: Action) -> Observation:
        command = action.arguments.get("command")
        if action.kind != "bash" or not isinstance(command, str):
            problem = f"expected a bash action with a string 'command', got kind={action.kind!r}"
            problem += f" arguments={sorted(action.arguments)}"
            return Observation(
                content=problem,
                success=False,
                call_id=action.call_id,
                action_name=action.name,
                info={"error": "invalid_arguments"},
            )
        result = await self._exec(command, self.config.command_timeout)
        content, elided, limit = result.output, 0, output_limit(self.runtime)
        if result.truncated:
            content, elided = elide(content, self.config.truncated_keep_chars)
            cut_at = f"{limit:,} bytes" if limit else "the runtime's output limit"
            content += ("\n" if content and not content.endswith("\n") else "")
            content += f"[output truncated at {cut_at}; the command was stopped]\n"
        return Observation(
            content=content,
            success=result.returncode == 0 and not result.timed_out,
            call_id=action.call_id,
            action_name="bash",
            info={
                "returncode": result.returncode,
                "timed_out": result.timed_out,
                "truncated": result.truncated,
                "output_limit": limit,
                "elided_chars": elided,
                "duration": result.duration,
                "timeout": self.config.command_timeout,
                "command": command,
            },
        )

    async def _exec(self, command: str, timeout: float) -> ExecResult:
        return await self.runtime.exec(command, timeout=timeout, cwd=self.config.cwd, env=self.config.env or None)
