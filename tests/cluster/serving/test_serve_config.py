"""The serve section, checked before anything deploys, and what the builders pass through as given."""

from __future__ import annotations

import pytest

from cluster.serving.config import DEFAULT_MAX_ONGOING_REQUESTS, ServeSection
from cluster.serving.controls import EndpointControls, NotSupported, ScriptedControls
from cluster.serving.kinds.vllm import llm_config_fields
from cluster.serving.kinds.vllm_subprocess import engine_command
from rollout.config.load import validate
from rollout.errors import ConfigError


def test_a_vllm_app_without_a_model_names_the_field():
    with pytest.raises(ConfigError, match="serve.model_source"):
        validate(ServeSection, {"app": "vllm"}, prefix="serve")
    with pytest.raises(ConfigError, match="serve.router"):
        validate(ServeSection, {"app": "scripted", "router": "random"}, prefix="serve")


def test_serve_and_fake_server_together_are_refused():
    from cluster.config.run_config import RunConfig

    with pytest.raises(ConfigError, match="keep one"):
        validate(RunConfig, {"model": {"type": "openai"}, "dataset": {"path": "x.jsonl"},
                             "serve": {"app": "scripted"}, "fake_server": {"policy": "echo"}})


def test_engine_and_deployment_options_pass_through_with_a_finite_request_bound():
    section = ServeSection(app="vllm", model_source="/m", cpu=True, replicas=3,
                           engine_kwargs={"max_model_len": 4096, "tool_call_parser": "hermes"},
                           deployment={"ray_actor_options": {"num_cpus": 2}},
                           llm_config={"accelerator_type": "A10G", "runtime_env": {"env_vars": {"A": "1"}}})
    fields = llm_config_fields(section, "m", section.num_replicas_options())
    assert fields["model_loading_config"] == {"model_id": "m", "model_source": "/m"}
    assert fields["engine_kwargs"]["max_model_len"] == 4096 and fields["engine_kwargs"]["tool_call_parser"] == "hermes"
    assert fields["deployment_config"] == {"max_ongoing_requests": DEFAULT_MAX_ONGOING_REQUESTS, "num_replicas": 3,
                                           "ray_actor_options": {"num_cpus": 2}}
    assert fields["runtime_env"] == {"env_vars": {"A": "1", "VLLM_LOGGING_LEVEL": "WARNING"}}  # a quiet engine
    assert fields["engine_kwargs"]["use_tqdm_on_load"] is False
    loud = ServeSection(app="vllm", model_source="/m", engine_kwargs={"use_tqdm_on_load": True},
                        llm_config={"runtime_env": {"env_vars": {"VLLM_LOGGING_LEVEL": "INFO"}}})
    told = llm_config_fields(loud, "m", {})
    assert told["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "INFO"  # the section's word wins
    assert told["engine_kwargs"]["use_tqdm_on_load"] is True
    # the CPU tier: the cpu accelerator and no accelerator type, a memory share a shared machine has
    assert fields["accelerator_config"] == {"kind": "cpu"} and "accelerator_type" not in fields
    assert fields["engine_kwargs"]["gpu_memory_utilization"] == 0.1
    autoscaled = ServeSection(app="scripted", deployment={"autoscaling_config": {"min_replicas": 1}})
    assert "num_replicas" not in autoscaled.num_replicas_options()


def test_the_subprocess_engine_turns_engine_arguments_into_flags():
    command = engine_command("/m", "tiny", 8001, {"max_model_len": 2048, "enable_auto_tool_choice": True,
                                                  "enforce_eager": False, "override_generation_config": {"a": 1}})
    assert command[command.index("--max-model-len") + 1] == "2048"
    assert "--enable-auto-tool-choice" in command and "--enforce-eager" not in command
    assert command[command.index("--override-generation-config") + 1] == '{"a": 1}'
    assert command[command.index("--served-model-name") + 1] == "tiny"


def test_what_a_model_cannot_do_raises_not_supported():
    scripted = ScriptedControls()
    scripted.pause("keep"), scripted.resume(), scripted.reset_prefix_cache()  # nothing to do: the farm's gate holds
    for call in (lambda: scripted.reload_weights("/ckpt"), scripted.sleep, scripted.wake_up):
        with pytest.raises(NotSupported):
            call()
    for call in (EndpointControls().pause, EndpointControls().resume, EndpointControls().reset_prefix_cache):
        with pytest.raises(NotSupported):
            call()


def test_the_serve_section_may_sit_inside_the_model_section():
    from cluster.config.run_config import RunConfig

    config = validate(RunConfig, {"model": {"type": "openai", "model": "m", "serve": {"app": "scripted"}},
                                  "dataset": {"path": "x.jsonl"}})
    assert config.serve.app == "scripted" and "serve" not in config.model
    with pytest.raises(ConfigError, match="given twice"):
        validate(RunConfig, {"model": {"type": "openai", "serve": {"app": "scripted"}}, "serve": {"app": "endpoint"},
                             "dataset": {"path": "x.jsonl"}})
