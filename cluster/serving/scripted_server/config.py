"""The scripted server's config and the faults it injects on purpose (failures, rate limits, hangs, refusals)."""

from __future__ import annotations

from pydantic import Field, field_validator

from rollout.access import checked_token
from rollout.config.load import StrictModel
from rollout.models.scripted import Output


class FaultsConfig(StrictModel):
    match: str = ""
    """Faults apply to requests whose rollout id starts with this ("" = every request)."""
    fail_first_n: int = Field(default=0, ge=0)
    """The first n requests of each rollout id get ``status`` (per rollout id, so that concurrent
    rollouts and the retries of one request each see their own count)."""
    status: int = 500
    """The status code of ``fail_first_n`` failures."""
    rate_limit_first_n: int = Field(default=0, ge=0)
    """The next n requests of each rollout id (after ``fail_first_n``) get 429 with ``Retry-After``."""
    retry_after: float = Field(default=1.0, ge=0)
    """Seconds sent in the 429's ``Retry-After`` header."""
    hang: float = Field(default=0.0, ge=0)
    """Seconds to stall every matching request before answering (a large value = hang until the
    client gives up; the handler is cancelled when the client disconnects)."""
    context_length_after_tokens: int | None = Field(default=None, ge=1)
    """Answer vLLM's context-length 400 when the prompt has more fake tokens than this."""
    max_request_bytes: int | None = Field(default=None, ge=1)
    """Answer 413 to request bodies over this many bytes, as a proxy's body limit does (the server's own limit,
    aiohttp's 1 MiB, applies to every request anyway)."""
    lone_surrogates: bool = False
    """End every reply's text with a lone surrogate escape (``"\\ud800"``), as a server's JSON encoder writes
    broken text: a strict client decoder refuses the whole reply."""


class ScriptedServerConfig(StrictModel):
    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port; 0 picks a free one (read it from ``ScriptedServer.url``)."""
    token: str | None = Field(default=None, repr=False)
    """The bearer token every request needs (``Authorization: Bearer <token>``: a client's ``api_key``), admin routes
    included. None: none on a loopback ``host``; on any other, one generated at start (``ScriptedServer.token``,
    printed once by ``rollout fake-server``)."""
    latency: float = Field(default=0.0, ge=0)
    """Seconds every completion takes, like a model's generation time."""
    policy: str | None = None
    """A scripted policy's short name or dotted path (``echo`` when neither this nor ``outputs`` is set)."""
    outputs: list[Output] | None = None
    """Outputs replayed in order per rollout id, instead of a policy."""
    dataset: str | None = None
    """JSONL of tasks (rows carry ``task_id``), looked up by the request's metadata ``task_id``."""
    model: str = "scripted"
    """The model name served by ``/v1/models`` and echoed in responses."""
    check_model: bool = True
    """Answer 404 (``model_not_found``) to a request naming another model, as OpenAI and vLLM do. Off only for a
    run's own in-process server (``for_runs``), which serves the run's model under whatever name its config
    gives it."""
    backlog: int = Field(default=8192, ge=1)
    """Listen backlog: thousands of clients connect at once (the kernel may cap it at somaxconn)."""
    faults: FaultsConfig = Field(default_factory=FaultsConfig)
    """Faults at start; replace at runtime with ``POST /admin/faults``."""

    @field_validator("token")
    @classmethod
    def _usable_token(cls, token: str | None) -> str | None:
        return checked_token(token)
