"""cluster: the CLI and run driver; later everything Ray (the only package that imports ray)."""
