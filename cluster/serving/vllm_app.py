"""A real model through ``ray.serve.llm``: ``LLMConfig`` + ``build_openai_app``. The section's engine arguments,
deployment options and any other ``LLMConfig`` fields pass through as given; this module only fills in the
model's name and path, the CPU accelerator when ``cpu`` is set, and the router and finite
``max_ongoing_requests`` defaults."""

from __future__ import annotations

from typing import Any

from cluster.serving.config import ServeSection


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
    return fields


def build(section: ServeSection, model_id: str, options: dict[str, Any]) -> Any:
    from ray.serve.llm import LLMConfig, build_openai_app

    config = LLMConfig(**llm_config_fields(section, model_id, options))
    return build_openai_app({"llm_configs": [config]})
