"""An agent harness we did not write — mini-swe-agent's own CLI, pinned from PyPI, unmodified — plays the SWE demo
inside each instance's container on two separate machines (their own docker daemons, empty image stores): the
harness is installed into the images on the machines that run them, the run opens the model gateway itself in the
machines' workers, and each container reaches it through a bound socket without any network."""

from __future__ import annotations

import collections
import json

import pytest
from separate_machines import finished, results, run_on_cluster

from rollout.models import scripted_tokens

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1500)]


def test_mini_swe_agents_cli_resolves_the_demo_on_fresh_machines_through_the_runs_gateway(
        ray_cluster, two_machines, head_files):
    address = ray_cluster.get_runtime_context().gcs_address
    run = run_on_cluster(address, head_files, "run.concurrency=4", config="swe_mini_agent.yaml")
    out = finished(run, timeout=1200)
    assert "gateway: the agent's model calls go through the run's own gateway" in out
    rows = [r for r in results(head_files) if r["status"] == "completed"]
    assert len(rows) == 12 and all(r["reward"] == 1.0 for r in rows), [(r["task_id"], r["reward"]) for r in rows]
    assert collections.Counter(r["rollout_id"] for r in rows).most_common(1)[0][1] == 1  # nothing twice
    assert {r["node_id"] for r in rows} <= {m.node_id() for m in two_machines}  # the head ran none
    calls = 0
    for row in rows:
        path = head_files / "run" / "trajectories" / row["task_id"] / f"0.a{row['attempt']}.json"
        steps = json.loads(path.read_text())["trajectory"]["steps"]
        assert [s["message"]["tool_calls"][0]["function"]["name"] for s in steps] == ["bash"] * 3  # mini's own tool
        for step in steps:  # every model call, with the token ids and logprobs the engine returned
            text = scripted_tokens.render_reply(step["message"])
            assert step["completion_token_ids"] == scripted_tokens.token_ids(text)
            assert step["logprobs"] == pytest.approx(scripted_tokens.logprobs(text))
            assert step["prompt_token_ids"]
            calls += 1
    for machine in two_machines:  # the harness was installed on the machine that ran it; nothing left running
        images = machine.docker("images", "--format", "{{.Repository}}").stdout.split()
        assert "rollout-farm/harness" in images
        assert machine.docker("ps", "-aq", "--filter", "label=rollout-farm.run").stdout.split() == []
    print(f"12/12 resolved by mini-swe-agent's CLI on two machines, {calls} model calls through the gateway")
