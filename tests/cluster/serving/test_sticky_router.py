"""The sticky least-loaded router's bookkeeping, without a cluster: a session stays on its replica, new sessions go
to the replica holding the fewest, a release or the TTL frees one, and a session whose replica is gone moves."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")


def _router(replicas, ttl=600.0):
    from collections import Counter

    from cluster.serving.router import StickyLeastLoadedRouter

    router = object.__new__(StickyLeastLoadedRouter)  # the state ``initialize_state`` makes, without Serve's
    router._session_ttl, router._sessions, router._load = ttl, {}, Counter()
    router._last_sweep = time.monotonic()
    router._replicas = {r.replica_id: r for r in replicas}
    return router


def _choose(router, session):
    request = SimpleNamespace(metadata=SimpleNamespace(session_id=session), routing_context=SimpleNamespace())
    [[chosen]] = asyncio.run(router.choose_replicas(list(router._replicas.values()), request))
    return chosen.replica_id


def test_sessions_stay_new_ones_balance_and_releases_free_their_replica():
    a, b = SimpleNamespace(replica_id="a"), SimpleNamespace(replica_id="b")
    router = _router([a, b])
    homes = {s: _choose(router, s) for s in ("s1", "s2", "s3", "s4")}
    assert sorted(homes.values()) == ["a", "a", "b", "b"]
    assert all(_choose(router, s) == home for s, home in homes.items())  # later turns: the same replica
    assert router.sessions_per_replica() == {"a": 2, "b": 2}
    on_a = [s for s, home in homes.items() if home == "a"]
    for session in on_a:
        assert _choose(router, "release:" + session) == "a"
    assert router.sessions_per_replica() == {"b": 2}
    assert _choose(router, "s5") == "a"  # the replica with the fewest sessions
    del router._replicas["b"]  # b is gone: its sessions move, and are counted where they went
    assert _choose(router, "s3" if homes["s3"] == "b" else "s1") == "a"
    assert router.sessions_per_replica()["a"] == 2


def test_sessions_not_heard_from_for_the_ttl_are_forgotten():
    a = SimpleNamespace(replica_id="a")
    router = _router([a], ttl=0.01)
    _choose(router, "old")
    time.sleep(0.02)
    _choose(router, "new")
    assert set(router._sessions) == {"new"} and router.sessions_per_replica() == {"a": 1}
