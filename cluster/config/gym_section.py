"""The ``gym`` section of a run config: the NeMo-Gym-compatible agent server's address and limits; its cleanup
timeout handed to the environments that close a session (``give_cleanup_timeout``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from envs.registry import ENVIRONMENTS
from rollout.access import checked_token
from rollout.config.load import StrictModel
from rollout.errors import ConfigError
from rollout.protocols import EnvironmentCapabilities, declared


class GymSection(StrictModel):
    host: str = "127.0.0.1"
    """Where the agent server listens (``rollout gym serve``); 0.0.0.0 to be reachable from other machines."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Its port (0: any free port)."""
    token: str | None = Field(default=None, repr=False)
    """The bearer token every request needs when ``host`` is not loopback (``Authorization: Bearer <token>``;
    ``/health`` stays open and says only ``ok``); None: one is generated at start and printed once. On 127.0.0.1 none
    is needed unless one is set here. The mounted gateway's routes need it too."""
    max_concurrent_episodes: int | None = Field(default=256, ge=1)
    """Episodes run at once; more wait up to ``queue_timeout`` for a place (None: no limit)."""
    queue_timeout: float = Field(default=600.0, gt=0)
    """Seconds an episode may wait for a place; then it fails at the ``admission`` stage (non-terminal)."""
    episode_timeout: float | None = Field(default=21600.0, gt=0)
    """Seconds one episode may take, retries included; then it fails as ``agent_timeout`` (non-terminal)."""
    max_body_bytes: int | None = Field(default=8 * 2**20, ge=1024)
    """Largest request body taken, in bytes: a larger one is answered 413 as it arrives, never read whole (None: no
    limit). 8 MiB is ten times a 128k-token conversation as text."""
    cleanup_timeout: float = Field(default=30.0, gt=0)
    """Seconds the resources server's ``/close_session`` may take (given to resources environments)."""
    allow_repo_paths: bool = False
    """Take rows naming a repository path on this machine (``repo_path``: SWE rows of a local benchmark). Off by
    default: over HTTP, anyone who can reach the server could name any path."""
    serve: bool = False
    """Run the agent server as a Ray Serve deployment (behind Serve's HTTP proxy) instead of in this process."""
    route_prefix: str = "/"
    """The Serve application's route prefix."""
    gateway: str | None = None
    """Upstream OpenAI-compatible base URL for the per-rollout model gateway (``/rollouts/<id>/v1``); None: the
    run's model URL when it has one, else no gateway."""

    @field_validator("token")
    @classmethod
    def _usable_token(cls, token: str | None) -> str | None:
        return checked_token(token)


def closes_sessions(section: Any) -> bool:
    """Whether an ``environment`` section names a class that closes a session on a remote server: its class
    flag ``closes_sessions`` (``rollout.protocols.EnvironmentCapabilities``), the class found as the run finds it."""
    if not isinstance(section, dict) or not isinstance(section.get("type"), str):
        return False
    try:
        return declared(ENVIRONMENTS.load(section["type"]), EnvironmentCapabilities).closes_sessions
    except ConfigError:
        return False  # an unknown type: the run config's own check names it


def give_cleanup_timeout(raw: dict[str, Any], seconds: float) -> None:
    """``seconds`` as the ``cleanup_timeout`` of every environment section of a run config (top level and each
    profile's) that closes a session and sets none of its own."""
    profiles = (raw.get("profiles") or {}).values()
    for section in [raw.get("environment"), *[(p or {}).get("environment") for p in profiles]]:
        if closes_sessions(section):
            section.setdefault("cleanup_timeout", seconds)
