"""The OpenAI-compatible model's config: endpoint, key, timeouts and retries, concurrency, sampling, token data."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rollout.config.load import StrictModel


class OpenAIModelConfig(StrictModel):
    type: str = "openai"
    """Registry name (``rollout.models.registry.MODELS``)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """The API root; requests go to ``{base_url}/chat/completions``."""
    model: str = ""
    """The served model name sent in every request."""
    api_key: str | None = Field(default=None, repr=False)
    """Bearer token; when unset it is read from the environment variable ``api_key_env``."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the key; an empty or missing key sends no Authorization header."""
    timeout: float = Field(default=600.0, gt=0)
    """Seconds per request attempt, connect to last byte."""
    max_retries: int = Field(default=5, ge=0)
    """Retries after the first attempt, on connection errors, timeouts, 408/409/425/429 and 5xx."""
    backoff: float = Field(default=0.5, ge=0)
    """First retry delay in seconds; doubles per retry, with jitter."""
    max_backoff: float = Field(default=30.0, ge=0)
    """Cap on one retry delay, a server's ``Retry-After`` included."""
    max_concurrency: int = Field(default=16384, ge=1)
    """Requests in flight at once from this process (per event loop); more wait in a queue."""
    max_connections: int = Field(default=0, ge=0)
    """aiohttp connection-pool limit; 0 = unlimited, leaving ``max_concurrency`` as the only bound."""
    http_client: Literal["auto", "aiohttp"] = "auto"
    """``auto``: the built-in HTTP/1.1 client (``rollout.models.client.http1``, a fraction of aiohttp's CPU per request)
    for ``http://`` URLs without a ``max_connections`` cap, aiohttp otherwise (TLS). ``aiohttp``: always."""
    keepalive_timeout: float = Field(default=60.0, gt=0)
    """Seconds an idle pooled connection is kept for reuse. Longer than a model call: with thousands of
    rollouts in flight the pool hands out its oldest idle connection, and one dropped at aiohttp's default
    (15 s) costs a new TCP connection on both sides. A server that closes sooner is noticed, not an error."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Default sampling parameters (temperature, top_p, max_tokens, seed, stop, ...); per-call ones win."""
    tool_choice: str | dict[str, Any] | None = None
    """Sent with requests that carry tools ("auto", "required", or a named function)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Merged into every request body last (engine-specific fields, e.g. ``chat_template_kwargs``)."""
    extra_headers: dict[str, str] = Field(default_factory=dict)
    """Added to every request."""
    return_token_ids: bool = False
    """Ask vLLM for ``prompt_token_ids`` and per-choice ``token_ids`` (``"return_token_ids": true``)."""
    logprobs: bool = False
    """Ask for the sampled tokens' logprobs (``choices[0].logprobs.content[i].logprob``)."""
    send_metadata: bool = True
    """Put the rollout identity into the body as ``metadata`` (string values). vLLM and SGLang ignore
    it; turn it off for servers that reject unknown fields (hosted OpenAI refuses ``metadata`` unless
    ``store`` is set). The ``X-Rollout-Id`` header is always sent."""
    release_sessions: bool = False
    """When a rollout ends, ``POST {base_url}/sessions/release`` with ``x-session-id: release:<rollout id>``, so a
    session-sticky router frees the rollout's replica at once (set for a run's scripted Serve app; a router that
    is not told forgets the session after its TTL)."""
    cache_salt: bool = False
    """Send ``cache_salt: "policy-<version>"`` (vLLM) with requests that carry a policy version: prefix-cache
    entries of one policy version are never reused under another. Off for servers that reject the field."""
    token_in: bool = False
    """Keep each rollout's token stream on the client (vLLM): turn k's prompt is turn k-1's prompt ids + its
    completion ids + the ids of the new messages as the server's ``/tokenize`` renders them, sent to
    ``/v1/completions`` as token ids; the stream is exact by construction (``rollout.models.client.token_in``)."""
    token_in_route: Literal["completions", "generate"] = "completions"
    """Token-in mode's route: ``completions`` (``/v1/completions`` with a token-id prompt: every vLLM and SGLang
    serves it) or ``generate`` (vLLM's token-in, token-out ``/inference/v1/generate``: the reply also names the
    weights version that sampled it, which becomes the turn's ``policy_version``). ``completions`` is the default
    because ``vllm serve`` mounts generate only with ``--enable-scale-out`` and other engines lack it; this farm's
    Serve apps (scripted and vLLM) answer both."""
    tokenizer: str | None = None
    """Token-in mode: render prompts with this tokenizer directory (its chat template, ``transformers``) in this
    process instead of the server's ``/tokenize``. Set for a run's ``serve`` vLLM app on ``ray_serve_llm``."""
    tool_call_format: str = "hermes"
    """How tool calls appear in raw completion text (token-in mode parses them itself): ``hermes``
    (``<tool_call>{"name", "arguments"}</tool_call>``)."""
