"""Separate machines on this one: a Ray node with its own docker daemon and filesystem view per machine."""
