"""vLLM's token-in, token-out route on the Serve model tier."""
