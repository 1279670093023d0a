"""Short names of the model seam's implementations and of the generic scripted policies this package ships
(domain policies, which play one environment, live beside it and are named in ``envs/registry.py``)."""

from __future__ import annotations

from rollout.registry import Registry

MODELS = Registry("model", {
    "scripted": "rollout.models.scripted:ScriptedModel",
    "openai": "rollout.models.client.model:OpenAIModel",
})
POLICIES = Registry("policy", {
    "echo": "rollout.models.policies:echo",
    "bash_echo": "rollout.models.policies:bash_echo",
    "oracle": "rollout.models.policies:oracle",
    "seed_writer": "rollout.models.policies:seed_writer",
})
"""Policies a scripted model or the scripted server takes by short name; others by dotted path (``cluster`` turns
the other packages' short names, such as ``demo``, into their paths first)."""
