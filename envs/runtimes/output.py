"""Command output helpers shared by runtimes: a byte buffer with a hard cap, forgiving decoding, elision, and a
runtime's declared cap."""

from __future__ import annotations

from rollout.config.components import CapsOutput
from rollout.protocols import HasConfig


class CappedOutput:
    """Collects output bytes up to ``limit``; anything past it is dropped and marks ``truncated``.

    Bounded on purpose: a command like ``yes`` must cost at most ``limit`` bytes of memory.
    """

    __slots__ = ("limit", "data", "truncated")

    def __init__(self, limit: int):
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> bool:
        """Append ``chunk``; return True once the cap has been exceeded (the caller should stop the command)."""
        if self.truncated:
            return True
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.data += chunk[:room]
            self.truncated = True
        else:
            self.data += chunk
        return self.truncated

    def text(self) -> str:
        return decode(self.data)


def decode(data: bytes | bytearray) -> str:
    """UTF-8 with undecodable bytes (binary output, a multi-byte character cut at the cap) replaced."""
    return data.decode("utf-8", errors="replace")


def elide(text: str, keep: int) -> tuple[str, int]:
    """``text`` cut to its first and last ``keep // 2`` characters around a line saying how many were left
    out, and that number (0: ``text`` was short enough and is returned whole)."""
    if len(text) <= keep:
        return text, 0
    half = keep // 2
    gone = len(text) - 2 * half
    tail = text[len(text) - half:] if half else ""
    return f"{text[:half]}\n... {gone:,} characters elided ...\n{tail}", gone


def output_limit(runtime: object) -> int | None:
    """The most bytes of a command's output ``runtime`` keeps: its section's ``max_output_bytes`` (``CapsOutput``),
    or None when it declares no cap (no section, or one without it: the null runtime)."""
    if isinstance(runtime, HasConfig) and isinstance(runtime.config, CapsOutput):
        return runtime.config.max_output_bytes
    return None
