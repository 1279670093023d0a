"""What the farm reads from a Harbor ``task.toml`` (``envs.harbor.task_config`` parses it): the task, its phases
(the agent's and the verifier's settings), its steps and its healthcheck."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Healthcheck:
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


@dataclass
class Phase:
    """The agent's or a verifier's settings."""
    timeout_sec: float | None = None
    user: str | None = None
    network_mode: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    environment_mode: str = "shared"


@dataclass
class Step:
    name: str
    agent: Phase
    verifier: Phase
    min_reward: float | dict[str, float] | None = None
    healthcheck: Healthcheck | None = None


@dataclass
class TaskConfig:
    schema_version: str = "1.0"
    name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    agent: Phase = field(default_factory=Phase)
    verifier: Phase = field(default_factory=lambda: Phase(timeout_sec=600.0))
    network_mode: str = "no-network"
    network_mode_set: bool = False
    docker_image: str | None = None
    build_timeout_sec: float = 600.0
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    healthcheck: Healthcheck | None = None
    solution_env: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    multi_step_reward_strategy: str = "mean"
    unknown: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
