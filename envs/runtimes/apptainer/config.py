"""The apptainer runtime's config: image (.sif, docker-daemon:, docker://), network, binds, limits, caches."""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import Field, field_validator

from rollout.config.load import StrictModel


class ApptainerRuntimeConfig(StrictModel):
    type: str = "apptainer"
    """Registry short name of this runtime."""
    binary: str | None = None
    """The CLI to drive (a name on PATH or a path); none: the first of apptainer, singularity on PATH."""
    image: str = "docker-daemon:rollout-farm/base:bookworm"
    """A local image (.sif or sandbox directory), or a reference (``docker-daemon:<ref>``, ``docker://<ref>``,
    ...) converted once into ``cache_dir``; delete the cached .sif to pick up a rebuilt docker image."""
    cache_dir: str | None = None
    """Where converted images live; none: ``$ROLLOUT_HOME/.apptainer-cache``, else the XDG cache directory."""
    workdir: str = "/workspace"
    """Where commands run by default, in the container; relative ``cwd`` and file paths are relative to it."""
    workspace_mount: str | None = None
    """Where the per-rollout host directory is bound in the container; none: at ``workdir``. Set it elsewhere
    when ``workdir`` is a directory the image provides (``/testbed``), which a bind would hide."""
    workspace_root: str | None = None
    """Parent directory of the per-rollout host directories; none: the system temp directory."""
    keep_workspace: bool = False
    """Leave the host directory on disk after ``close()`` (for debugging)."""
    network: Literal["none", "host"] = "none"
    """``none``: loopback only (``--net --network none``; unprivileged users need apptainer 1.1 or later);
    ``host``: the host's network."""
    containall: bool = True
    """``--containall``: private /tmp, $HOME, IPC and PID namespace, clean environment. The private $HOME stays
    writable (pip and git want one), so ``--no-home`` is off by default."""
    no_home: bool = False
    """``--no-home``: do not mount any home directory."""
    writable_tmpfs: bool = True
    """``--writable-tmpfs``: the image is writable, changes kept in memory (apptainer.conf caps the size)."""
    binds: list[str] = Field(default_factory=list)
    """Extra ``--bind`` specs, ``src[:dest[:ro]]``."""
    memory: str | None = None
    """``--memory`` limit (``2g``); needs cgroups v2 delegation for unprivileged users."""
    cpus: float | None = Field(None, gt=0)
    """``--cpus`` limit."""
    pids_limit: int | None = Field(None, gt=0)
    """``--pids-limit``."""
    start_args: list[str] = Field(default_factory=list)
    """More ``instance start`` flags, verbatim (``--fakeroot``, ``--nv``)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for every command (the host's environment is never passed in)."""
    shell: list[str] = Field(default_factory=lambda: ["bash", "-lc"], min_length=1)
    """Argv, inside the container, the command string is appended to."""
    timeout: float = Field(30.0, gt=0)
    """Default per-command timeout in seconds; ``exec(timeout=...)`` overrides it."""
    kill_grace: float = Field(2.0, gt=0)
    """Seconds between ``timeout``'s SIGTERM and its SIGKILL, inside the container."""
    host_grace: float = Field(10.0, ge=0)
    """Seconds past timeout + kill_grace before this host kills the CLI process itself (a hung CLI)."""
    max_output_bytes: int = Field(1_000_000, ge=1)
    """Combined stdout+stderr kept per command; past it the command is stopped and ``truncated`` set."""
    start_timeout: float = Field(120.0, gt=0)
    """Seconds ``instance start`` may take."""
    build_timeout: float = Field(1800.0, gt=0)
    """Seconds converting a referenced image into a .sif may take."""

    @field_validator("workdir", "workspace_mount")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path in the container")
        return value if value is None else posixpath.normpath(value)

    @field_validator("workspace_root")
    @classmethod
    def _bindable(cls, value: str | None) -> str | None:
        if value is not None and (":" in value or "," in value):
            raise ValueError("cannot contain ':' or ',' (it goes into a --bind spec)")
        return value
