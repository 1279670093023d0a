"""What the agent server refuses or stops, over real HTTP: Responses fields of the wrong type (422 naming the field,
before any work), a body over the limit (413 while it arrives), and a client that leaves (its episode cancelled,
its container removed)."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid

import pytest

from .gym_servers import agent_server, episode, row

WRONG = [("tools", "calculator", "tools: a list of tools"),
         ("tools", [{"type": "function"}], "tools[0].name"),
         ("tools", [{"type": "web_search"}], "tools[0].type"),
         ("max_output_tokens", -5, "max_output_tokens: an integer >= 1"),
         ("max_output_tokens", "many", "max_output_tokens"),
         ("temperature", "hot", "temperature: a number"),
         ("temperature", 7, "temperature"),
         ("top_p", [1], "top_p: a number"),
         ("top_p", 0, "top_p"),
         ("tool_choice", "sometimes", "tool_choice"),
         ("stream", True, "stream")]


def with_field(field, value) -> dict:
    body = row()
    body["responses_create_params"][field] = value
    return body


def test_wrong_typed_responses_fields_get_a_422_naming_the_field_before_any_work(calc):
    with agent_server(calc.url, faults={"fail_first_n": 1000, "status": 500}) as client:  # a model call would 502
        for field, value, named in WRONG:
            legacy = client.post("/run", json=with_field(field, value))
            responses = client.post("/v1/responses", json=with_field(field, value)["responses_create_params"])
            failed = client.post("/run", json=episode(with_field(field, value), f"bad-{field}")).json()["failure"]
            assert legacy.status_code == 422, (field, value, legacy.text)
            assert legacy.json()["error"]["type"] == "invalid_request"
            assert f"body.responses_create_params.{named}" in legacy.json()["error"]["message"], legacy.text
            assert responses.status_code == 422 and f"body.{named}" in responses.json()["error"]["message"]
            assert failed["terminal"] is True and failed["stage"] == "admission" and named in failed["failure_reason"]
    with agent_server(calc.url) as client:  # the same fields, well typed, run
        good = row()
        good["responses_create_params"].update(temperature=0.7, top_p=1, max_output_tokens=512, tool_choice="auto")
        assert client.post("/run", json=good).json()["reward"] == 1.0


def test_a_body_over_the_limit_gets_a_413_as_it_arrives(calc):
    limit = 64 * 1024
    big = b'{"responses_create_params": {"input": "' + b"x" * 50_000_000 + b'"}}'
    sent = []

    def chunks():  # no content-length: the server counts what arrives
        for start in range(0, len(big), 65536):
            sent.append(65536)
            yield big[start:start + 65536]

    with agent_server(calc.url, gym={"max_body_bytes": limit}) as client:
        declared = client.post("/run", content=big, headers={"content-type": "application/json"})
        chunked = client.post("/run", content=chunks(), headers={"content-type": "application/json"})
        under = client.post("/run", json=row())
    for reply in (declared, chunked):
        assert reply.status_code == 413, reply.text
        error = reply.json()["error"]
        assert error["type"] == "request_too_large" and "gym.max_body_bytes" in error["message"]
    assert sum(sent) < len(big) / 2, "the server stopped reading: the client could not send the whole body"
    assert under.status_code == 200 and under.json()["reward"] == 1.0


def labelled(run_id: str) -> list[str]:
    shown = subprocess.run(["docker", "ps", "-a", "--filter", "label=rollout-farm.run",
                            "--format", '{{.ID}} {{.Label "rollout-farm.run"}}'], capture_output=True, text=True)
    return [line.split()[0] for line in shown.stdout.splitlines() if line.split()[1:2] and
            line.split()[1].startswith(run_id)]


def post_and_hang_up(url: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.sendall(b"POST /run HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    return conn


@pytest.mark.docker
def test_a_client_that_disconnects_ends_its_episode_and_frees_its_container(base_image):
    import json

    run_id = f"gym-gone-{uuid.uuid4().hex[:8]}"
    shell = {"run_id": run_id, "model": {"type": "scripted", "policy": "seed_writer"},
             "agent": {"type": "mini_swe", "max_steps": 5}, "environment": {"type": "shell", "command_timeout": 120},
             "runtime": {"type": "docker", "image": base_image, "cpus": 0.5, "memory": "256m"},
             "verifier": {"type": "check_command"}}
    slow = {"responses_create_params": {"input": "Write your seed."}, "task_id": "t0", "pause": 120,
            "check": "test -s seed.txt"}
    with agent_server("http://127.0.0.1:9", gym={"max_concurrent_episodes": 1, "queue_timeout": 5}, **shell) as client:
        try:
            conn = post_and_hang_up(str(client.base_url), json.dumps(slow).encode())
            deadline = time.monotonic() + 60
            while not labelled(run_id) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert labelled(run_id), "the episode's container started"
            conn.close()  # the client leaves mid-episode (its command sleeps for 120 s)
            t0 = time.monotonic()
            while labelled(run_id) and time.monotonic() - t0 < 10:
                time.sleep(0.1)
            assert labelled(run_id) == [], "the episode's container outlived its client by 10 s"
            gone = time.monotonic() - t0
            quick = client.post("/run", json={**slow, "pause": 0})  # its place is free again
        finally:
            subprocess.run(["docker", "rm", "-f", *labelled(run_id)], capture_output=True)
    assert quick.status_code == 200 and quick.json()["reward"] == 1.0, quick.text
    assert gone < 5, f"the container was removed {gone:.1f}s after the client left"
