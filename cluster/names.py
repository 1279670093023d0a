"""Every package's table of short names, read in one place (composition lives here, so ``rollout/`` names no
implementation): models, agents, parsers, environments, runtimes, verifiers, scripted policies."""

from __future__ import annotations

from typing import Any

from agents.registry import AGENTS, PARSERS, POLICIES as AGENT_POLICIES
from envs.registry import ENVIRONMENTS, POLICIES as ENV_POLICIES, RUNTIMES, VERIFIERS
from rollout.models.registry import MODELS, POLICIES as MODEL_POLICIES

POLICIES = MODEL_POLICIES.merged(ENV_POLICIES).merged(AGENT_POLICIES)
__all__ = ["AGENTS", "ENVIRONMENTS", "MODELS", "PARSERS", "POLICIES", "RUNTIMES", "VERIFIERS", "with_policy_path"]


def with_policy_path(section: Any, field: str) -> Any:
    """A model or fake-server section whose ``policy`` short name is replaced by its import path (checked), so
    the scripted model in ``rollout.models`` loads any package's policy by path."""
    if not isinstance(section, dict) or not isinstance(section.get("policy"), str):
        return section
    POLICIES.load(section["policy"], field=field)  # an unknown name fails here, naming the field
    return {**section, "policy": POLICIES.resolve(section["policy"])}
