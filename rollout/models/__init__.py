"""Model seam implementations: the scripted model, the OpenAI-compatible client, the scripted server."""
