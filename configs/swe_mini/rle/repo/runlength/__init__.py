"""Run-length encoding of text."""

from runlength.codec import decode, encode

__all__ = ["decode", "encode"]
