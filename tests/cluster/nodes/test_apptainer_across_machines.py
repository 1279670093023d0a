"""The SWE demo with ``runtime.type=apptainer`` on two separate machines (their own docker daemons with empty image
stores, their own files): each machine gets the images it needs as a docker run would, converts each once into its
own apptainer cache, and runs every rollout and its grading in apptainer instances, unprivileged."""

from __future__ import annotations

import collections

import pytest
from separate_machines import finished, results, run_on_cluster

pytestmark = [pytest.mark.docker, pytest.mark.apptainer, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1500)]


def test_the_demo_resolves_in_apptainer_instances_on_fresh_machines(ray_cluster, two_machines, head_files,
                                                                    apptainer_binary):
    address = ray_cluster.get_runtime_context().gcs_address
    # Six of the demo's instances: the first conversion of each on each machine is most of the time (12/12 measured).
    run = run_on_cluster(address, head_files, "runtime.type=apptainer", "run.concurrency=4", "dataset.slice=0:6")
    finished(run, timeout=1200)
    rows = [r for r in results(head_files) if r["status"] == "completed"]
    assert len(rows) == 6 and all(r["reward"] == 1.0 for r in rows), [(r["task_id"], r["reward"]) for r in rows]
    assert collections.Counter(r["rollout_id"] for r in rows).most_common(1)[0][1] == 1  # nothing twice
    nodes = collections.Counter(r["node_id"] for r in rows)
    assert set(nodes) <= {m.node_id() for m in two_machines}  # the head ran none
    for machine in two_machines:  # no container: the sandboxes were apptainer's
        assert machine.docker("ps", "-aq", "--filter", "label=rollout-farm.run").stdout.split() == []
    assert len(nodes) == 2, nodes  # both machines ran some
    print(f"6/6 resolved in apptainer instances on two machines: rollouts per node {dict(nodes)}")
