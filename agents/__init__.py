"""agents: agent loops, action parsers, tools and prompt templates."""
