"""Short names of the environments, runtimes and verifiers."""

from __future__ import annotations

from rollout.registry import Registry

ENVIRONMENTS = Registry("environment", {
    "tool": "envs.tool_env:ToolEnvironment",
    "step": "envs.step_env:StepEnvironmentAdapter",
    "shell": "envs.shell_env:ShellEnvironment",
    "swe": "envs.swe.env:SweEnvironment",
    "harbor": "envs.harbor.env:HarborEnvironment",
    "aviary": "envs.resources.aviary_env:AviaryEnvironment",
    "resources": "envs.resources.client:ResourcesEnvironment",
})
RUNTIMES = Registry("runtime", {
    "null": "envs.runtimes.null:NullRuntime",
    "local": "envs.runtimes.local:LocalRuntime",
    "docker": "envs.runtimes.docker.runtime:DockerRuntime",
    "podman": "envs.runtimes.docker.runtime:DockerRuntime",
    "apptainer": "envs.runtimes.apptainer.runtime:ApptainerRuntime",
})
VERIFIERS = Registry("verifier", {
    "check_command": "envs.verifiers:CheckCommandVerifier",
    "answer_match": "envs.verifiers:AnswerMatchVerifier",
    "env_reward": "envs.verifiers:EnvRewardVerifier",
    "swe": "envs.swe.verifier:SweVerifier",
    "harbor": "envs.harbor.verifier:HarborVerifier",
})
POLICIES = Registry("policy", {
    "gold": "envs.swe.policies:gold",
    "empty": "envs.swe.policies:empty",
    "replay": "envs.swe.policies:replay",
    "calculator": "envs.resources.policies:calculator",
    "guesser": "envs.resources.policies:guesser",
    "tool_user": "envs.resources.policies:tool_user",
    "harbor_solver": "envs.harbor.policies:harbor_solver",
})
"""Scripted policies that play one of these environments (the SWE gold patch, the calculator server's task
family, a Harbor task's own solution), beside the environments they know."""
