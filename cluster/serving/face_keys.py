"""The keys a model's HTTP face takes beyond loopback: the key it was deployed with, and the key of every later run
that reuses the kept application. A run's client is given its key before the cluster is joined (the composer
ships it to the workers while the model starts), so a standing application learns the keys of the runs that reuse
it through Ray's key-value store instead of being deployed again for each."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from cluster.session.ray_private import kv_del, kv_get, kv_keys, kv_put
from rollout.access import allowed

PREFIX = "rollout-farm/serve-keys/"
REFRESH = 1.0
"""Seconds a replica keeps what it read of the store (it reads again on the next request after that)."""


def _entry(app: str, key: str) -> str:
    return f"{PREFIX}{app}/{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def admit(app: str, key: str) -> None:
    """Application ``app``'s face takes ``key`` from now on (its replicas read it on their next unknown key)."""
    kv_put(_entry(app, key), key.encode())


def forget(app: str, key: str | None = None) -> None:
    """``key`` (None: every key admitted) is no longer taken by ``app``'s face, except the one it was deployed with."""
    for entry in [_entry(app, key).encode()] if key is not None else kv_keys(f"{PREFIX}{app}/"):
        kv_del(entry)


class FaceKeys:
    """A replica's check (``rollout.access.Keys``): the key its application was deployed with, else one a run
    admitted and has not withdrawn (the store read at most once every ``REFRESH`` seconds)."""

    def __init__(self, app: str, first: str):
        self.app, self.first = app, first
        self._admitted: tuple[str, ...] = ()
        self._read_at = float("-inf")

    def accepts(self, given: str) -> bool:
        if allowed(given, self.first):
            return True
        now = time.monotonic()
        if now - self._read_at >= REFRESH:  # admitted and withdrawn keys seen within a second
            self._read_at = now
            values = (kv_get(entry) for entry in kv_keys(f"{PREFIX}{self.app}/"))
            self._admitted = tuple(value.decode() for value in values if value)
        return any([allowed(given, key) for key in self._admitted])  # every key compared: no early out

    def __getstate__(self) -> dict[str, Any]:
        return {"app": self.app, "first": self.first}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["app"], state["first"])
