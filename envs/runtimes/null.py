"""NullRuntime: a Runtime that executes nothing and answers instantly, for load tests and scripted demos."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from rollout.config.load import StrictModel, coerce
from rollout.errors import RuntimeFailure
from rollout.protocols import ExecResult

_NEW, _STARTED, _CLOSED = 0, 1, 2


class NullRuntimeConfig(StrictModel):
    type: str = "null"
    """Registry short name of this runtime."""
    output: str = ""
    """Canned output every command returns."""
    returncode: int = 0
    """Canned return code every command returns."""
    echo: bool = False
    """Echo the command (then the canned output), so a scripted agent sees something change. A plain
    ``echo WORDS`` gives ``WORDS`` as the shell would (no expansion), so scripted submissions work."""
    delay: float = Field(0.0, ge=0)
    """Seconds each command takes (an ``asyncio.sleep``), to model command latency in load tests."""
    workdir: str = "/workspace"
    """The directory this runtime pretends commands run in (reported to environments, never touched)."""


class NullRuntime:
    """Every command returns the canned result. Files live in a per-instance dict.

    Thousands run in one process, so an instance is a few slots and a lazily created dict.
    """

    __slots__ = ("config", "_state", "_files")

    def __init__(self, config: NullRuntimeConfig | Mapping[str, Any] | None = None):
        config = coerce(NullRuntimeConfig, config, prefix="runtime")
        self.config = config
        self._state = _NEW
        self._files: dict[str, bytes] | None = None

    @classmethod
    def from_config(cls, config: NullRuntimeConfig | Mapping[str, Any], **_: Any) -> "NullRuntime":
        return cls(config)

    @property
    def workdir(self) -> str:
        return self.config.workdir

    async def start(self) -> None:
        if self._state == _CLOSED:
            raise RuntimeFailure("NullRuntime.start() after close()", retryable=False)
        self._state = _STARTED

    async def exec(
        self, command: str, timeout: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_open()
        config = self.config
        if config.delay:
            if timeout is not None and config.delay > timeout:
                await asyncio.sleep(timeout)
                self._check_open()
                return ExecResult.model_construct(
                    output="", returncode=-9, timed_out=True, truncated=False, duration=timeout
                )
            await asyncio.sleep(config.delay)
            self._check_open()
        output = f"{_echoed(command)}\n{config.output}" if config.echo else config.output
        # model_construct: the values are already typed, and validation would be most of the cost.
        return ExecResult.model_construct(
            output=output, returncode=config.returncode, timed_out=False, truncated=False, duration=config.delay
        )

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        if self._files is None:
            self._files = {}
        self._files[posixpath.normpath(path)] = bytes(data)

    async def read_file(self, path: str) -> bytes:
        """The bytes last written to ``path``; ``FileNotFoundError`` if none were."""
        self._check_open()
        data = self._files.get(posixpath.normpath(path)) if self._files is not None else None
        if data is None:
            raise FileNotFoundError(path)
        return data

    async def close(self) -> None:
        self._state = _CLOSED
        self._files = None

    def _check_open(self) -> None:
        if self._state != _STARTED:
            closed = self._state == _CLOSED
            raise RuntimeFailure("NullRuntime is closed" if closed else "NullRuntime used before start()")


def _echoed(command: str) -> str:
    if command.startswith("echo ") and "\n" not in command and not any(c in command for c in "$`|;&><"):
        return command[5:].strip()
    return command
