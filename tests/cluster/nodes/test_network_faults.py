"""What a real cluster's network does to a run, on separate machines with their own addresses: a machine cut off
past Ray's node timeout and then back (its in-flight rollouts run again elsewhere; what it finished while cut off is
never recorded; its containers go), a shorter cut (nothing runs again), and the model node that dies under its
replicas (Serve places them on the other model node, the calls in flight are tried again, nothing is lost).

The rule that keeps a run whole: a result counts only through the attempt the driver still owns. An attempt the
driver gave up on (its worker's node declared dead) is failed as ``worker_died`` and dropped from its channel, so
a result that machine sends later has nowhere to land, and the rollout's next attempt is the only one recorded."""

from __future__ import annotations

import collections
import re
import time

import pytest
from separate_machines import MODEL, SANDBOX, finished, lend, replica_nodes, results, run_on_cluster
from test_swe_across_machines import assert_whole, labelled, results_reach

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]


def wait_for(check, timeout: float, step: float = 0.5) -> float | None:
    """Seconds until ``check()`` held (None: it did not within ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(step)
    return None


def counts(head_files) -> dict:
    rows = results(head_files)
    done = collections.Counter(r["rollout_id"] for r in rows if r["status"] == "completed")
    return {"rollouts": len(done), "attempts": len(rows), "reruns": sum(1 for r in rows if r["status"] != "completed"),
            "duplicates": sum(n - 1 for n in done.values())}


def test_a_short_cut_reruns_nothing_and_a_cut_past_the_node_timeout_costs_reruns_and_nothing_else(
        ray_cluster, two_machines, head_files):
    """One run, two cuts of one machine's link: 6 s (inside Ray's health-check window), then past the node timeout."""
    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, "run.samples=2", "run.max_attempts=3")  # 24 rollouts
    survivor, cut = two_machines
    results_reach(run, head_files, 3)
    assert run.poll() is None, "the run ended before the machine could be cut off"
    lost = cut.node_id()
    cut.netns.cut()
    time.sleep(6)
    still = cut.joined()
    cut.netns.restore()
    assert still, "Ray declared the node dead within 6 s"
    short = counts(head_files)["attempts"]
    results_reach(run, head_files, short + 2)  # the machine's work goes on after the short cut
    after_short = counts(head_files)
    on_it = sum(1 for r in results(head_files) if r["node_id"] == lost)
    print(f"\nshort cut (6s): {after_short['attempts']} results so far, {after_short['reruns']} reruns, "
          f"{on_it} ran on the machine cut off, which is still in the cluster")
    assert after_short["reruns"] == 0, results(head_files)
    assert run.poll() is None, "the run ended before the machine could be cut off again"

    in_flight = len(labelled(cut))
    cut.netns.cut()
    try:
        declared = wait_for(lambda: not cut.joined(), timeout=240, step=1)
        assert declared is not None, "Ray did not declare the cut-off machine's node dead"
        time.sleep(10)  # still cut off: its rollouts go on there, finished or not, their results held
        finished_while_cut = len(labelled(cut))
    finally:
        cut.netns.restore()
    gone = wait_for(lambda: labelled(cut) == [], timeout=120)
    out = finished(run)
    rows = assert_whole(head_files, expected=24)  # every rollout once: 0 lost, 0 duplicated
    assert all(r["reward"] == 1.0 for r in rows), [(r["task_id"], r.get("exit_reason")) for r in rows]
    tally = counts(head_files)
    reran = [r for r in results(head_files) if r["status"] != "completed"]
    assert reran and all(r["node_id"] == lost and r["exit_reason"] == "worker_died" for r in reran), reran
    assert not cut.joined(), "the machine's node came back into the cluster after it was declared dead"
    line = re.search(rf"node lost\s+{lost[:8]}[^\n]*", out)
    assert line, out[-3000:]
    left = len(labelled(cut))
    print(f"partition past the node timeout: {tally['rollouts']} rollouts, {tally['reruns']} reruns, "
          f"{tally['duplicates']} duplicates, {left} containers left on the cut-off machine ({in_flight} at the "
          f"cut, {finished_while_cut} when the link came back, gone {gone and round(gone, 1)}s later); declared "
          f"dead {declared:.0f}s after the cut\n{line.group(0)}")
    assert gone is not None and left == 0, "the cut-off machine's containers outlived its node"
    assert "partition" in line.group(0), line.group(0)  # the summary names what cost the reruns
    assert labelled(survivor) == []


@pytest.fixture
def two_model_machines_and_a_sandbox(machines, head_files, base_image):
    return lend(machines, MODEL, MODEL, SANDBOX)


def test_the_model_node_that_dies_moves_its_replicas_and_loses_nothing(ray_cluster, two_model_machines_and_a_sandbox,
                                                                       head_files):
    first, second, sandbox = two_model_machines_and_a_sandbox
    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, "run.samples=2", "run.max_attempts=3", config="across_machines.yaml")
    results_reach(run, head_files, 4)
    assert run.poll() is None, "the run ended before the model node could be killed"
    before = replica_nodes()
    victim = max((first, second), key=lambda m: before.get(m.node_id(), 0))
    survivor = second if victim is first else first
    victim.kill()
    killed = time.monotonic()
    moved = wait_for(lambda: replica_nodes().get(survivor.node_id(), 0) >= 2, timeout=300, step=1)
    out = finished(run)
    rows = assert_whole(head_files, expected=24)
    assert all(r["reward"] == 1.0 for r in rows), [(r["task_id"], r.get("exit_reason")) for r in rows]
    tally = counts(head_files)
    line = re.search(r"model tier[^\n]*", out)
    left = len(labelled(sandbox))
    print(f"\nmodel node killed: {tally['rollouts']} rollouts, {tally['reruns']} reruns, {tally['duplicates']} "
          f"duplicates, {left} containers left; replicas before {before}, both on the survivor {moved}s after the kill "
          f"({time.monotonic() - killed:.0f}s to the run's end)\n{line.group(0) if line else out[-1500:]}")
    assert moved is not None, f"Serve did not place the replicas on the surviving model node: {replica_nodes()}"
    assert {r["node_id"] for r in rows} == {sandbox.node_id()}
    assert line and re.search(r"[12] of 2 replicas lost \d+s into the run; recovered", line.group(0)), out[-3000:]
    assert tally["duplicates"] == 0 and left == 0
