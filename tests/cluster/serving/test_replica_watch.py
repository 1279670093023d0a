"""The model tier's outages as the run's summary gives them: replicas lost (followed by id), how far into the run,
and how long until the target ran again (``cluster.serving.replica_watch``; the real thing: a model node killed
mid-run, ``tests/cluster/nodes/test_network_faults.py``)."""

from __future__ import annotations

from cluster.serving.replica_watch import Look, ReplicaWatch
from rollout.store.summary import format_table, summarize


def look(*running: str, target: int = 2, dead: tuple[str, ...] = ()) -> Look:
    return Look(target, frozenset(running), frozenset(dead))


def table(watch: ReplicaWatch) -> str:
    summary = summarize([], wall_seconds=60)
    summary["model_tier"] = watch.report()
    return format_table(summary)


def test_an_outage_is_the_stretch_with_fewer_running_than_the_target_and_ends_when_all_run_again():
    watch = ReplicaWatch("rollout-model")
    start = watch._began
    for at, seen in [(1, look("a")), (2, look("a", "b")), (5, look("a", "b")), (7, look()), (9, look("c")),
                     (30.5, look("c", "d")), (32, look("c", "d"))]:
        watch.note(seen, start + at)
    assert watch.report() == {"replicas": 2, "outages": [{"at": 7, "lost": 2, "seconds": 23.5}]}
    assert "model tier      2 of 2 replicas lost 7s into the run; recovered: all 2 running again after 23.5s" \
        in table(watch)


def test_a_replica_replaced_before_the_look_saw_it_gone_is_still_an_outage():
    """The look every 2 s can come after Serve already runs the replacement: the count is whole again, the ids say
    one replica was lost (the model node's death this missed once in four runs, counted by number)."""
    watch = ReplicaWatch("rollout-model")
    start = watch._began
    watch.note(look("a", "b"), start + 1)
    watch.note(look("a", "c", dead=("b",)), start + 3)
    watch.note(look("a", "c", dead=("b",)), start + 5)  # still listed dead: counted once
    assert watch.report() == {"replicas": 2, "outages": [{"at": 3, "lost": 1, "seconds": 0}]}
    assert "1 of 2 replicas lost 3s into the run; recovered: its replacement was running by the look" in table(watch)


def test_starting_up_is_no_outage_and_one_not_over_by_the_end_says_so():
    watch = ReplicaWatch("rollout-model")
    start = watch._began
    watch.note(look(), start + 1)
    watch.note(look("a"), start + 2)  # the tier is not whole yet: no outage before it was
    watch.note(look("a", "b"), start + 3)
    assert watch.report() is None
    watch.note(look("b"), start + 4)
    assert "model tier      1 of 2 replicas lost 4s into the run; not all running again by the end" in table(watch)
