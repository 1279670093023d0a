"""Short names for implementations, resolved lazily to import paths (a dotted path works too).

The tables are plain strings: nothing is imported until a config names it, so ``rollout``
stays free of ``agents``/``envs``/``cluster`` imports at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

from rollout.errors import ConfigError


class Registry:
    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind
        self.entries = dict(entries)

    def register(self, name: str, path: str) -> None:
        self.entries[name] = path

    def names(self) -> list[str]:
        return sorted(self.entries)

    def resolve(self, name: str) -> str:
        return self.entries.get(name, name)

    def load(self, name: str, field: str = "") -> Any:
        """The object a short name or ``pkg.module:attr`` / ``pkg.module.attr`` path names."""
        path = self.resolve(name)
        if ":" in path:
            module_name, _, attr = path.partition(":")
        elif "." in path:
            module_name, _, attr = path.rpartition(".")
        else:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; choose one of {', '.join(self.names())} or give a dotted import path",
                field or self.kind,
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"cannot import {module_name!r} for {self.kind} {name!r}: {exc}", field or self.kind) from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no attribute {attr!r} ({self.kind} {name!r})", field or self.kind) from None


MODELS = Registry(
    "model",
    {
        "scripted": "rollout.models.scripted:ScriptedModel",
        "openai": "rollout.models.openai_client:OpenAIModel",
    },
)
AGENTS = Registry(
    "agent",
    {
        "tool_calling": "agents.tool_agent:ToolCallingAgent",
        "text_action": "agents.text_agent:TextActionAgent",
        "mini_swe": "agents.swe_agent:MiniSweAgent",
    },
)
PARSERS = Registry(
    "parser",
    {
        "openai_tools": "agents.parsers.openai_tools:OpenAIToolsParser",
        "json": "agents.parsers.json_action:JSONActionParser",
        "react": "agents.parsers.react:ReActParser",
        "function_calls": "agents.parsers.function_calls:FunctionCallsParser",
        "bash_block": "agents.parsers.bash_block:BashBlockParser",
    },
)
ENVIRONMENTS = Registry(
    "environment",
    {
        "tool": "envs.tool_env:ToolEnvironment",
        "step": "envs.step_env:StepEnvironmentAdapter",
        "shell": "envs.shell_env:ShellEnvironment",
        "swe": "envs.swe_env:SweEnvironment",
    },
)
RUNTIMES = Registry(
    "runtime",
    {
        "null": "envs.null_runtime:NullRuntime",
        "local": "envs.local_runtime:LocalRuntime",
        "docker": "envs.docker_runtime:DockerRuntime",
        "podman": "envs.docker_runtime:DockerRuntime",
        "apptainer": "envs.apptainer_runtime:ApptainerRuntime",
    },
)
VERIFIERS = Registry(
    "verifier",
    {
        "check_command": "envs.verifiers:CheckCommandVerifier",
        "answer_match": "envs.verifiers:AnswerMatchVerifier",
        "env_reward": "envs.verifiers:EnvRewardVerifier",
        "swe": "envs.swe_grading:SweVerifier",
    },
)
POLICIES = Registry(
    "policy",
    {
        "demo": "agents.demo.policy:demo_policy",
        "echo": "rollout.models.policies:echo",
        "bash_echo": "rollout.models.policies:bash_echo",
        "oracle": "rollout.models.policies:oracle",
        "seed_writer": "rollout.models.policies:seed_writer",
        "gold": "rollout.models.swe_policies:gold",
        "empty": "rollout.models.swe_policies:empty",
        "replay": "rollout.models.swe_policies:replay",
    },
)
