"""Which node a rollout goes to: slots per node, image locality, node health."""
