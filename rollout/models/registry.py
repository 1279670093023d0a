"""Short names of the model seam's implementations and of the scripted policies this package ships."""

from __future__ import annotations

from rollout.registry import Registry

MODELS = Registry("model", {
    "scripted": "rollout.models.scripted:ScriptedModel",
    "openai": "rollout.models.openai_client:OpenAIModel",
})
POLICIES = Registry("policy", {
    "echo": "rollout.models.policies:echo",
    "bash_echo": "rollout.models.policies:bash_echo",
    "oracle": "rollout.models.policies:oracle",
    "seed_writer": "rollout.models.policies:seed_writer",
    "gold": "rollout.models.swe_policies:gold",
    "empty": "rollout.models.swe_policies:empty",
    "replay": "rollout.models.swe_policies:replay",
    "calculator": "rollout.models.tool_policies:calculator",
    "guesser": "rollout.models.tool_policies:guesser",
    "tool_user": "rollout.models.tool_policies:tool_user",
})
"""Policies a scripted model or the fake server takes by short name; others by dotted path (``cluster`` turns
the other packages' short names, such as ``demo``, into their paths first)."""
