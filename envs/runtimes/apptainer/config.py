"""The apptainer runtime's config: image (.sif, sandbox, docker-daemon:, docker-archive:, docker://, a bare name),
network, binds, limits (cgroup flags where the site delegates them; resource limits the farm sets itself), caches."""

from __future__ import annotations

import posixpath
import re
import resource
from typing import Literal

from pydantic import Field, field_validator

from rollout.config.load import StrictModel


class ApptainerRuntimeConfig(StrictModel):
    type: str = "apptainer"
    """Registry short name of this runtime."""
    binary: str | None = None
    """The CLI to drive (a name on PATH or a path); none: the first of apptainer, singularity on PATH."""
    image: str = "docker-daemon:rollout-farm/base:bookworm"
    """A local image (a .sif file or a sandbox directory), a reference (``docker-daemon:<ref>``,
    ``docker-archive:<file.tar>``, ``docker://<ref>``, ...) or a bare name read through ``transport``; all but a
    sandbox directory are converted once per node into ``cache_dir`` (delete the cached copy to pick up a rebuilt
    image under the same name)."""
    transport: Literal["docker-daemon", "docker", "oras", "library"] = "docker-daemon"
    """Where a bare image name (``rollout-farm/instance:x``, as the SWE environment names instance images) is read
    from: ``docker-daemon`` (this node's docker holds it), ``docker`` (a registry), ..."""
    convert_to: Literal["sandbox", "sif"] = "sandbox"
    """What sources are converted into: a ``sandbox`` directory (unprivileged users with neither squashfuse nor a
    loop device cannot mount a SIF, and apptainer would unpack it again for every instance; a local .sif is unpacked
    once too) or a ``sif`` (sites where SIFs mount)."""
    cache_dir: str | None = None
    """Where converted images live, per node; none: ``$ROLLOUT_HOME/.apptainer-cache``, else the XDG cache
    directory."""
    userns: bool = True
    """``--userns``: run in a user namespace as the calling user, unprivileged (no setuid starter), as HPC users
    do. Off: apptainer's own choice (setuid where the site installed it so)."""
    workdir: str = "/workspace"
    """Where commands run by default, in the container; relative ``cwd`` and file paths are relative to it."""
    workspace_mount: str | None = None
    """Where the per-rollout host directory is bound in the container; none: at ``workdir`` when the image (a
    sandbox directory, looked into) has no such directory, else at ``/rollout-workspace``, so that a bind never
    hides a directory the image provides (``/testbed``); ``workdir`` is then made if the image lacks it."""
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
    """``--memory`` limit (``2g``); a cgroup limit: needs cgroups v2 delegation to unprivileged users."""
    cpus: float | None = Field(None, gt=0)
    """``--cpus`` limit (a cgroup limit, as ``memory``)."""
    pids_limit: int | None = Field(None, gt=0)
    """``--pids-limit`` (a cgroup limit, as ``memory``)."""
    max_file_size: str | None = Field("1g", pattern=r"^[0-9]+[bkmgBKMG]?$")
    """Largest file a command may write (the ``fsize`` resource limit, e.g. "1g", "64m"): a writer past it gets
    SIGXFSZ, so ``dd`` or ``yes > f`` cannot fill the node's disk through the workspace. None: no limit."""
    ulimits: dict[str, int | str] = Field(default_factory=dict)
    """More resource limits the farm sets on each command (no cgroups needed), ``{"nproc": 512, "as": "4g"}``:
    names are ``setrlimit``'s (as, core, cpu, data, fsize, memlock, nofile, nproc, stack), a value ``n`` or
    ``soft:hard``, sizes with k/m/g. ``nproc`` counts every process of the user on the node, and the kernel
    does not apply it to root. Set inside the container with the image's ``prlimit`` (util-linux), on the command
    alone; an image without it takes only core, cpu, fsize and memlock (set on apptainer's CLI, which they do not
    hinder) and refuses the others at start."""
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

    @field_validator("ulimits")
    @classmethod
    def _known_limits(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        for name, limit in value.items():
            if not hasattr(resource, f"RLIMIT_{name.upper()}"):
                raise ValueError(f"{name!r} is not a resource limit (as, core, cpu, data, fsize, nofile, nproc, ...)")
            for part in str(limit).split(":"):
                if not _LIMIT.fullmatch(part):
                    raise ValueError(f"{name}: {limit!r} is not a number, a size (64m) or soft:hard")
        return value


_LIMIT = re.compile(r"[0-9]+[kmgKMG]?|unlimited")
