"""A rollout in the formats other tools read: ATIF-v1.8 trajectories (``rollout.formats.atif``) and SFT rows in the
shape of Harbor's trace export (``rollout.formats.sharegpt``); a run directory exported (``rollout.formats.export``)."""
