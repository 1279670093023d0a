"""Runtimes: where a rollout's commands run (local workspace, docker/podman, apptainer, null) and their plumbing."""
