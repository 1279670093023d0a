"""Short names resolved lazily to import paths (a dotted path works too): the ``Registry`` every package's
table of names uses. Each package owns its table (``rollout/models/registry.py``, ``agents/registry.py``,
``envs/registry.py``); composition in ``cluster/`` reads them, so ``rollout/`` names no implementation."""

from __future__ import annotations

import importlib
from typing import Any

from rollout.errors import ConfigError


class Registry:
    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind
        self.entries = dict(entries)

    def register(self, name: str, path: str) -> None:
        self.entries[name] = path

    def names(self) -> list[str]:
        return sorted(self.entries)

    def resolve(self, name: str) -> str:
        return self.entries.get(name, name)

    def merged(self, other: "Registry") -> "Registry":
        """A registry with both tables (``other`` wins a clash)."""
        return Registry(self.kind, {**self.entries, **other.entries})

    def load(self, name: str, field: str = "") -> Any:
        """The object a short name or ``pkg.module:attr`` / ``pkg.module.attr`` path names."""
        path = self.resolve(name)
        if ":" in path:
            module_name, _, attr = path.partition(":")
        elif "." in path:
            module_name, _, attr = path.rpartition(".")
        else:
            choices = ", ".join(self.names())
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of {choices} or give a dotted import path",
                              field or self.kind)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"cannot import {module_name!r} for {self.kind} {name!r}: {exc}",
                              field or self.kind) from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no attribute {attr!r} ({self.kind} {name!r})",
                              field or self.kind) from None
