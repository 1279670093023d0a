"""The docker/podman runtime's config: image, limits (memory, cpus, pids, file size, disk), TTL, dead-man's switch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollout.config.load import StrictModel


class DockerRuntimeConfig(StrictModel):
    type: str = "docker"
    """Registry short name of this runtime."""
    engine: Literal["docker", "podman"] | None = None
    """Container engine; none: podman if ``type`` is "podman", else docker."""
    base_url: str | None = None
    """Engine API address; none: docker from the environment (DOCKER_HOST), podman from its API socket
    (started by us if nothing answers: see ``envs.runtimes.docker.engines.podman_url``)."""
    image: str = "rollout-farm/base:bookworm"
    """Image to run (`rollout images base` / `rollout images build` make ours)."""
    pull: Literal["never", "missing"] = "never"
    """"never": a missing image is an error; "missing": pull it from its registry first. For podman, copy an
    image from docker with `podman pull docker-daemon:<image>`."""
    harness: list[str] = Field(default_factory=list)
    """Pip requirements installed into the container's image as a layer of their own before it starts (wheels fetched
    on the machine that builds; containers have no network), e.g. ``["mini-swe-agent==2.4.6"]``: their console
    scripts run from ``/usr/local/bin``, and what those run does not see their packages
    (``envs.images.harness_images``)."""
    user: str | None = None
    """Who runs the commands (a name or uid); none: the image's USER."""
    workdir: str = "/workspace"
    """Where commands run by default (created if missing); SWE tasks use /testbed."""
    network: Literal["none", "bridge"] = "none"
    """"none": loopback only; "bridge": the engine's default network."""
    memory: str = Field("2g", pattern=r"^[0-9]+[bkmgBKMG]?$")
    """Memory limit (e.g. "2g", "256m"); swap is limited to the same total, so nothing spills to swap."""
    cpus: float = Field(1.0, gt=0)
    """CPU quota in cores."""
    pids_limit: int = Field(512, ge=16)
    """Most processes alive at once in the container (a fork bomb stops here)."""
    cap_add: list[str] = Field(default_factory=lambda: ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"])
    """Capabilities kept after dropping ALL: what root needs for ordinary file work (tar, cp -a, chown, files
    of other users; podman's root filesystem is not writable without DAC_OVERRIDE) and for tools that drop
    privileges (apt, su). No network, admin, ptrace or module capabilities."""
    security_opt: list[str] = Field(default_factory=lambda: ["no-new-privileges"])
    """Engine security options; no-new-privileges stops setuid binaries from gaining privileges."""
    init: bool = True
    """Run an init as PID 1 that reaps orphaned processes (docker-init, catatonit). When the engine has
    none (podman without catatonit), a shell waiting on the TTL timer is PID 1 and reaps instead."""
    ttl: float = Field(4 * 3600, gt=0)
    """Seconds after which the container stops and removes itself, whatever happens to this process."""
    die_with_owner: bool = True
    """The container stops and removes itself as soon as the process that started it dies, even of SIGKILL
    (a dead-man's switch: its main process reads a stream this process holds open). False: only close(),
    the exit hooks, the TTL and `rollout gc` remove it (e.g. to look into a container after a crash)."""
    shell: list[str] = Field(default_factory=lambda: ["bash", "-lc"], min_length=1)
    """Argv the command string is appended to."""
    timeout: float = Field(30.0, gt=0)
    """Default per-command timeout in seconds; ``exec(timeout=...)`` overrides it."""
    kill_grace: float = Field(2.0, gt=0)
    """Seconds between SIGTERM and SIGKILL when a command times out."""
    max_output_bytes: int = Field(1_000_000, ge=1)
    """Combined stdout+stderr kept per command; past it the command is killed and ``truncated`` set."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the container (every command sees them)."""
    binds: list[str] = Field(default_factory=list)
    """Host directories bound into the container, ``source:target[:ro]`` (the run binds its model gateway's socket
    directory here for an agent that needs one: ``rollout.config.components.BindsPaths``)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra container labels (ours, ``rollout-farm.*``, are always set)."""
    ulimits: dict[str, int | str] | None = None
    """Resource limits, ``{"nofile": "20000:20000", "nproc": 4096}``; none: the engine's defaults, except that
    podman gets nofile=20000:20000 and nproc=4096:4096 (its own defaults fail to apply in nested containers).
    An ``fsize`` here overrides ``max_file_size``."""
    max_file_size: str | None = Field("1g", pattern=r"^[0-9]+[bkmgBKMG]?$")
    """Largest file a command may write (ulimit fsize, e.g. "1g", "64m"): a writer past it gets SIGXFSZ
    ("File size limit exceeded"), so `dd` or `yes > f` cannot fill the engine's disk. None: no limit."""
    disk: str | None = Field("10g", pattern=r"^[0-9]+[bkmgBKMG]?$")
    """Size limit of the container's writable layer (``--storage-opt size``), where the storage driver
    supports it (overlay2 on xfs with pquota, devicemapper, btrfs, zfs); elsewhere skipped, logged once.
    None: no limit."""
    warm_pool: int = Field(0, ge=0)
    """Containers of this config kept started ahead in this process, so a rollout's first command does
    not wait for a container start (0: none). Each is handed to one rollout only; the pool refills in
    the background and is emptied when the run ends."""
    start_limit: int = Field(8, ge=1)
    """Container starts (create + start) in flight at once on one engine from one worker process; more wait their
    turn, first come first served, so a burst of rollouts never lands on the daemon in one instant."""
    start_rate: float | None = Field(20.0, gt=0)
    """Container starts begun per second on one engine from one worker process (None: no pacing)."""
    start_retries: int = Field(3, ge=0)
    """Times a start the engine failed under load (its own error, a dropped connection, a timeout) is tried
    again, after 0.5 s, 1 s, 2 s..., before the attempt fails as infrastructure (and the driver runs it again)."""
    run_id: str | None = None
    """Run id label (``rollout-farm.run``); the composition layer passes it as ``run_id=``."""
    rollout_id: str | None = None
    """Rollout id label (``rollout-farm.rollout``)."""

    @property
    def container_engine(self) -> str:
        """The engine the containers run on: ``engine``, else podman for ``type: podman``, else docker (a run reaps
        its leftovers there: ``rollout.config.components.RunsContainers``)."""
        return self.engine or ("podman" if self.type == "podman" else "docker")


PODMAN_ULIMITS = {"nofile": "20000:20000", "nproc": "4096:4096"}
"""podman's own defaults fail to apply in nested containers."""
