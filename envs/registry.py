"""Short names of the environments, runtimes and verifiers."""

from __future__ import annotations

from rollout.registry import Registry

ENVIRONMENTS = Registry("environment", {
    "tool": "envs.tool_env:ToolEnvironment",
    "step": "envs.step_env:StepEnvironmentAdapter",
    "shell": "envs.shell_env:ShellEnvironment",
    "swe": "envs.swe.swe_env:SweEnvironment",
    "aviary": "envs.resources.aviary_env:AviaryEnvironment",
    "resources": "envs.resources.client:ResourcesEnvironment",
})
RUNTIMES = Registry("runtime", {
    "null": "envs.runtimes.null_runtime:NullRuntime",
    "local": "envs.runtimes.local_runtime:LocalRuntime",
    "docker": "envs.runtimes.docker_runtime:DockerRuntime",
    "podman": "envs.runtimes.docker_runtime:DockerRuntime",
    "apptainer": "envs.runtimes.apptainer_runtime:ApptainerRuntime",
})
VERIFIERS = Registry("verifier", {
    "check_command": "envs.verifiers:CheckCommandVerifier",
    "answer_match": "envs.verifiers:AnswerMatchVerifier",
    "env_reward": "envs.verifiers:EnvRewardVerifier",
    "swe": "envs.swe.swe_verifier:SweVerifier",
})
