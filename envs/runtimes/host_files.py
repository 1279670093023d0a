"""Reading and writing files on the host, for runtimes whose workspace is a host directory (``HostWorkspace``)."""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable


@runtime_checkable
class HostWorkspace(Protocol):
    """A runtime whose files live in a directory of this host, ``workspace`` (None until it starts): the local
    runtime's commands run there; the apptainer runtime binds it into its container."""

    workspace: str | None


def read_host_file(target: str) -> bytes:
    with open(target, "rb") as f:
        return f.read()


def write_host_file(target: str, data: bytes) -> None:
    """Write ``data``, creating parent directories."""
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
