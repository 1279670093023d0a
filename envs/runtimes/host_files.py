"""Reading and writing files on the host, for runtimes whose workspace is a host directory."""

from __future__ import annotations

import os


def read_host_file(target: str) -> bytes:
    with open(target, "rb") as f:
        return f.read()


def write_host_file(target: str, data: bytes) -> None:
    """Write ``data``, creating parent directories."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
