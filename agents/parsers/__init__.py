"""Action parsers: turn a model message into actions or raise FormatError."""
