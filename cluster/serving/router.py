"""Sticky least-loaded request routing for Ray Serve: every turn of a rollout goes to the replica its first turn
went to, and a new rollout goes to the replica holding the fewest live sessions.

The session is the ``x-session-id`` header (the rollout id, sent by the model client). A request whose session
id is ``release:<id>`` ends session ``<id>`` (the client sends one when a rollout ends, failed or not); a session
not heard from for ``session_ttl`` seconds is forgotten too. Pure consistent hashing (Ray's experimental
``ConsistentHashRouter``, also selectable) keeps affinity but ignores load: a few long sessions hashed onto one
replica saturate it while others idle (``tests/perf/bench_serve.py`` compares the two).

Routers live in each caller process (Serve's HTTP proxy per node): with several proxies each balances its own
sessions.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any, List, Optional

from ray.serve.config import RequestRouterConfig
from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

from rollout.wire.chat import RELEASE_PREFIX

STICKY_ROUTER = "cluster.serving.router.StickyLeastLoadedRouter"
CONSISTENT_HASH_ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"


class StickyLeastLoadedRouter(ConsistentHashRouter):
    """Session affinity first, load second. Built on the consistent-hash router's routing loop, which retries a
    request on its chosen replica (with backoff) instead of handing it to whichever replica frees up first."""

    def initialize_state(self, session_ttl: float = 600.0, **kwargs: Any) -> None:
        super().initialize_state(**kwargs)
        self._session_ttl = float(session_ttl)
        self._sessions: dict[str, tuple[ReplicaID, float]] = {}
        self._load: Counter = Counter()  # live sessions per replica, kept with ``_sessions`` (O(1) per request)
        self._last_sweep = time.monotonic()

    def sessions_per_replica(self) -> Counter:
        return +self._load

    def _forget(self, session: str) -> None:
        held = self._sessions.pop(session, None)
        if held is not None:
            self._load[held[0]] -= 1

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < min(self._session_ttl, 10.0):
            return
        self._last_sweep = now
        cutoff = now - self._session_ttl
        for session in [s for s, (_, seen) in self._sessions.items() if seen < cutoff]:
            self._forget(session)

    async def choose_replicas(
        self, candidate_replicas: List[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        session = pending_request.metadata.session_id if pending_request is not None else ""
        if not session:
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True
        now = time.monotonic()
        self._sweep(now)
        releasing = session.startswith(RELEASE_PREFIX)
        key = session[len(RELEASE_PREFIX):] if releasing else session
        held = self._sessions.get(key)
        chosen = self._replicas.get(held[0]) if held is not None else None
        if chosen is None:  # a new session, or its replica is gone: the replica with the fewest sessions
            load = self._load
            chosen = min(candidate_replicas, key=lambda r: (load[r.replica_id], random.random()))
        if releasing:
            self._forget(key)
        elif held is not None and held[0] == chosen.replica_id:
            self._sessions[key] = (held[0], now)
        else:
            self._forget(key)
            self._sessions[key] = (chosen.replica_id, now)
            self._load[chosen.replica_id] += 1
        return [[chosen]]


def router_options(router: str, session_ttl: float) -> dict[str, Any]:
    """The ``request_router_config`` deployment option for a ``serve.router`` choice ({} for Ray's default)."""
    if router == "sticky":
        return {"request_router_config": RequestRouterConfig(
            request_router_class=STICKY_ROUTER, request_router_kwargs={"session_ttl": session_ttl})}
    if router == "consistent_hash":
        return {"request_router_config": RequestRouterConfig(request_router_class=CONSISTENT_HASH_ROUTER)}
    return {}
