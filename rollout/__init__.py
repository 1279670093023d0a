"""rollout: the core vocabulary (records, errors, seams) and the single-rollout loop. Pure Python."""
