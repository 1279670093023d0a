"""envs: runtimes (null, local, containers) and environments (tool, step, shell)."""
