"""Tools: typed definitions rendered to OpenAI schemas, and the registry that runs them."""
