"""The adaptive limit per node (``farm.adaptive``) on synthetic nodes: it raises concurrency while throughput rises,
backs off when throughput falls or start latency climbs, stays between 1 and the node's capacity, and says why
each time it moves; a node's workers share its limit."""

from __future__ import annotations

import random
from typing import Callable

from cluster.placement.adaptive import AdaptiveLimit, NodeLimits
from cluster.placement.slots import Node, queue_on, running
from rollout.errors import ExitReason
from rollout.records import RolloutResult

Rate = Callable[[float, int], float]
"""Completions per second of a node at time t running ``limit`` rollouts at once."""


def simulate(limit: AdaptiveLimit, rate: Rate, seconds: float, start: Callable[[int], float] = lambda n: 0.5,
             full: bool = True) -> list[tuple[float, int]]:
    """Rollouts finishing one after another at the node's rate (each took limit / rate seconds, Little's law); the
    limit after each."""
    t, seen = 0.0, []
    while t < seconds:
        now = limit.limit
        per_second = rate(t, now)
        t += 1 / per_second
        limit.note(t, now / per_second, start(now), full)
        seen.append((t, limit.limit))
    return seen


def linear(t: float, n: int) -> float:
    """Rollouts of 2 s whatever how many run: twice as many at once, twice the rate."""
    return n / 2


def knee(t: float, n: int) -> float:
    """A node whose CPUs serve 16 at once: beyond, contention makes every rollout slower than more of them gain."""
    return n / 2 if n <= 16 else 8 * 16 / n


def test_it_raises_the_limit_while_throughput_rises_up_to_the_nodes_capacity():
    limit = AdaptiveLimit(64, start=4, step=2, at=0.0)
    seen = simulate(limit, linear, 600)
    limits = [n for _, n in seen]
    assert limits == sorted(limits), "only ever up"
    assert limits[-1] == 64 and max(limits) == 64
    assert len(limit.changes) == 30 and all(c.new == c.old + 2 for c in limit.changes)
    assert limit.changes[0].why == "completions/s 2: +2"
    assert limit.changes[1].why == "completions/s 2 → 3: +2"


def test_past_the_knee_it_backs_off_and_the_node_does_more_than_at_its_full_capacity():
    adaptive = AdaptiveLimit(64, start=4, step=2, at=0.0)
    seen = simulate(adaptive, knee, 1200)
    settled = [n for t, n in seen if t > 300]
    assert 10 <= min(settled) and max(settled) <= 24, "it hovers around the knee (16), never runs away"
    cuts = [c for c in adaptive.changes if c.new < c.old]
    assert cuts and all(c.new == int(c.old * 0.7) for c in cuts)
    assert cuts[0].why.startswith("completions/s ") and "< 0.85× best " in cuts[0].why and cuts[0].why.endswith(
        ": ×0.7")
    fixed = AdaptiveLimit(64, start=64, step=1, at=0.0)  # what the node does at its capacity, never moved
    at_capacity = simulate(fixed, knee, 1200)
    assert len(seen) > 1.5 * len(at_capacity), "more rollouts done in the same time"


def test_it_backs_off_when_start_latency_climbs_though_throughput_still_rises():
    adaptive = AdaptiveLimit(64, start=4, step=2, at=0.0)
    seen = simulate(adaptive, linear, 600, start=lambda n: 0.5 if n <= 12 else 6.0)
    assert max(n for _, n in seen) == 14, "one step past where starts slow down, then back"
    cut = next(c for c in adaptive.changes if c.new < c.old)
    assert (cut.old, cut.new, cut.why) == (14, 9, "start p90 6.0 s > 2× 1.0 s: ×0.7")
    assert [n for t, n in seen if t > 300].count(14) < len([t for t, _ in seen if t > 300]) / 2


def test_a_cold_start_is_no_sign_of_load():
    """Starts that fetched their image first (``start=None``) do not count for latency."""
    adaptive = AdaptiveLimit(16, start=4, step=4, at=0.0)
    t = 0.0
    for k in range(200):
        t += 0.5
        adaptive.note(t, 2.0, None if k % 3 == 0 else 0.5)  # every third fetched a 60 s image: not counted
    assert adaptive.limit == 16 and all(c.new > c.old for c in adaptive.changes)


def test_the_limit_stays_between_one_and_the_capacity():
    small = AdaptiveLimit(6, start=4, step=4, at=0.0)
    assert max(n for _, n in simulate(small, linear, 300)) == 6
    assert small.changes[-1].why.endswith(": +2"), "the last step only up to the capacity"

    worse = AdaptiveLimit(64, start=20, step=2, at=0.0)  # the node does less and less, whatever it runs
    seen = [n for _, n in simulate(worse, lambda t, n: 20 * 0.98 ** t, 400)]
    assert seen[-1] == 1 and min(seen) == 1
    assert all(c.new >= 1 and c.new != c.old for c in worse.changes)
    assert AdaptiveLimit(3, start=10, step=1).limit == 3 and AdaptiveLimit(3, start=0, step=1).limit == 1


def test_a_node_with_room_to_spare_keeps_its_limit():
    """Rollouts that finish while the node runs fewer than its limit (the run's last ones) measure the demand, not
    what the node can do: the limit neither grows nor falls on them."""
    adaptive = AdaptiveLimit(64, start=8, step=2, at=0.0)
    simulate(adaptive, lambda t, n: 4.0 if t < 100 else 0.5, 300, full=False)
    assert adaptive.limit == 8 and adaptive.changes == []


def result(status: str = "completed", total: float = 2.0, reset: float = 0.5) -> RolloutResult:
    return RolloutResult(rollout_id="t#0", task_id="t", status=status,
                         exit_reason=ExitReason.SUBMITTED if status == "completed" else ExitReason.WORKER_DIED,
                         timings={"total": total, "reset": reset})


def test_a_nodes_workers_share_its_limit_and_run_no_more():
    workers = [Node("node-a", 5, index=0, actor=object()), Node("node-b", 5, index=1, actor=object())]
    for worker in workers:
        worker.node_id = "node-a"
    limits = NodeLimits(window=1.0)
    limits.join(workers, cpus=1, at=0.0)
    assert [w.slots for w in workers] == [2, 2] and limits.by_node["node-a"].limit == 4  # 2 per CPU, at least 4
    workers[0].used = 2
    assert workers[0].free == 0 and running(workers) == 2
    assert queue_on(workers, None, None) is None, "nothing is sent ahead before its attempts are timed"
    workers[0].seconds = 1.0
    assert queue_on(workers, None, None) is workers[0]  # up to its share waits there, no more
    workers[0].used = 4
    assert queue_on(workers, None, None) is None

    for k in range(8):  # failures are no throughput
        assert limits.note(workers, result("infra_failed"), held=True, full=True, at=0.5 * k) is None
    change, at = None, 4.0
    while change is None:  # completed ones of 2 s, 2 a second: the window closes at the 4th
        at += 0.5
        change = limits.note(workers, result(), held=True, full=True, at=at)
    assert (change.old, change.new, at) == (4, 5, 6.0) and [w.slots for w in workers] == [3, 2]
    report = limits.report()["node-a"]
    assert (report["capacity"], report["start"], report["limit"], report["changed"]) == (10, 4, 5, 1)
    assert report["changes"] == [change.as_dict()]
    assert NodeLimits(window=None).report() is None


def test_results_that_arrive_in_batches_do_not_look_like_a_fall():
    """Results reach the driver in batches, at uneven times: a window that caught two batches and one that caught
    none are one steady node, which only grows."""
    adaptive = AdaptiveLimit(32, start=4, step=2, window=2.0)
    arrivals = random.Random(7)
    t, waiting, delivery = 0.0, 0, 1.0
    while t < 200:
        t += 2 / adaptive.limit  # rollouts of 2 s, as many at once as the limit
        waiting += 1
        if t >= delivery:
            for _ in range(waiting):
                adaptive.note(delivery, 2.0, 0.5)
            waiting, delivery = 0, delivery + arrivals.expovariate(1 / 0.8)
    assert adaptive.limit == 32 and all(c.new > c.old for c in adaptive.changes)
