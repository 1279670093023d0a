"""A SWE row through ``/run``: the Mini SWE agent in its own workspace, graded by the SWE harness in a fresh one,
answered as a verify response; its ``/v1/responses`` is a 501; a row naming a path on the server's machine is
refused unless the server allows it."""

from __future__ import annotations

import json

import pytest

from envs.swe.mini import build

from .gym_servers import agent_server

SWE = {"agent": {"type": "mini_swe", "max_steps": 20},
       "environment": {"type": "swe", "command_timeout": 120},
       "runtime": {"type": "local", "timeout": 120}, "verifier": {"type": "swe", "eval_timeout": 300},
       "model": {"type": "scripted", "policy": "gold"}}


@pytest.fixture(scope="module")
def swe_rows(tmp_path_factory):
    path = build(tmp_path_factory.mktemp("swe_mini"), names=["roman", "slugify"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:  # the dataset loader makes repo_path absolute; a collector sends it as the server sees it
        row["repo_path"] = str((path.parent / row["repo_path"]).resolve())
    return [{"responses_create_params": {"input": row["problem_statement"]}, **row} for row in rows]


def test_a_swe_row_runs_the_mini_swe_agent_and_is_graded(swe_rows):
    with agent_server("http://127.0.0.1:9", gym={"allow_repo_paths": True}, **SWE) as client:
        replies = [client.post("/run", json=row) for row in swe_rows]
        responses = client.post("/v1/responses", json=swe_rows[0]["responses_create_params"])
    for reply, row in zip(replies, swe_rows):
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["reward"] == 1.0 and body["instance_id"] == row["instance_id"]
        texts = [i for i in body["response"]["output"] if i["type"] == "message"]
        assert texts and any("```bash" in t["content"][0]["text"] for t in texts)
    assert responses.status_code == 501


def test_a_row_naming_a_server_path_is_refused_by_default(swe_rows):
    with agent_server("http://127.0.0.1:9", **SWE) as client:
        reply = client.post("/run", json=swe_rows[0])
    assert reply.status_code == 422 and "repo_path" in reply.json()["error"]["message"]
