"""The model tier's outages as the run's summary gives them: replicas lost, how far into the run, and how long until
as many ran again (``cluster.serving.replica_watch``; the real thing: a model node killed mid-run,
``tests/cluster/nodes/test_network_faults.py``)."""

from __future__ import annotations

from cluster.serving.replica_watch import ReplicaWatch
from rollout.store.summary import format_table, summarize


def test_an_outage_is_the_stretch_with_fewer_replicas_than_the_tier_had_and_ends_when_all_run_again():
    watch = ReplicaWatch("rollout-model")
    start = watch._began
    for at, running in [(1, 1), (2, 2), (5, 2), (7, 0), (9, 1), (30.5, 2), (32, 2)]:
        watch.note(running, start + at)
    assert watch.report() == {"replicas": 2, "outages": [{"at": 7, "lost": 2, "seconds": 23.5}]}


def test_nothing_lost_is_no_report_and_an_outage_not_over_says_so():
    watch = ReplicaWatch("rollout-model")
    watch.note(2, watch._began + 1)
    assert watch.report() is None
    watch.note(1, watch._began + 4)
    summary = summarize([], wall_seconds=10)
    summary["model_tier"] = watch.report()
    assert "model tier      1 of 2 replicas lost 4s into the run; not all running again by the end" in \
        format_table(summary)
