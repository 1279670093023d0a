"""The per-rollout model gateway over real HTTP (the scripted server upstream), and the ExternalAgent: an agent that
knows only OPENAI_BASE_URL, run in a local workspace and in a real docker container."""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import urllib.error
import urllib.request

import openai
import pytest

from agents.external_agent import ExternalAgent
from cluster.gym.gateway import calls_to_steps, gateway_app
from cluster.serving.scripted_server.server import (
    FaultsConfig,
    ScriptedServerConfig,
    serve_in_thread as scripted_server_in_thread,
)
from envs.resources.serving import serve_in_thread
from envs.runtimes.docker.runtime import DockerRuntime
from envs.runtimes.local import LocalRuntime
from envs.shell_env import ShellEnvironment
from rollout.context import message_text
from rollout.models.client.model import OpenAIModel
from rollout.models.scripted import ScriptedModel
from rollout.records import RequestMeta, Task
from rollout.runner import run_rollout

SYSTEM = {"role": "system", "content": "You are a test agent."}

AGENT = r"""
import json, os, sys, urllib.request
base, task = os.environ["OPENAI_BASE_URL"], sys.stdin.read()
messages = [{"role": "system", "content": "You are a test agent."}, {"role": "user", "content": task}]
for turn in range(3):
    body = json.dumps({"model": "scripted", "messages": messages}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    reply = json.load(urllib.request.urlopen(request, timeout=30))
    assert "prompt_token_ids" not in reply and reply["choices"][0]["logprobs"] is None, reply
    content = reply["choices"][0]["message"]["content"]
    print(content)
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"result {turn}"}]
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""
"""A test agent that only speaks OpenAI over urllib: three calls, each extending the one before."""


def policy(messages, ctx):
    """Echo the last user or tool message; a user message starting with "tool:" gets a tool call."""
    last = message_text(next(m for m in reversed(messages) if m.get("role") in ("user", "tool")))
    if last.startswith("tool:"):
        return {"content": None, "tool_calls": [{"name": "ls", "arguments": {"path": last[5:]}}]}
    return "echo: " + last


@pytest.fixture(scope="module")
def upstream():
    faults = FaultsConfig(match="fail-", fail_first_n=1000, status=500)
    with scripted_server_in_thread(ScriptedServerConfig(faults=faults), ScriptedModel(policy=policy)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream):
    with serve_in_thread(gateway_app(upstream.url)) as server:
        yield server


def http(url, body=None, method=None):
    """(status, JSON body) of one request; error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method or ("GET" if body is None else "POST"),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def chat(gateway, rollout_id, messages, **extra):
    return http(f"{gateway.url}/rollouts/{rollout_id}/v1/chat/completions",
                {"model": "scripted", "messages": messages, **extra})


def calls(gateway, rollout_id):
    status, body = http(f"{gateway.url}/rollouts/{rollout_id}/calls")
    assert status == 200
    return body["calls"]


def assert_openai_error(status, body, expected):
    assert status == expected, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def test_a_call_that_extends_the_one_before_is_one_segment_with_contiguous_tokens(gateway):
    first = [SYSTEM, {"role": "user", "content": "hi"}]
    status, reply = chat(gateway, "chain", first)
    assert status == 200 and reply["choices"][0]["message"]["content"] == "echo: hi"
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]  # the agent did not ask
    assert reply["choices"][0]["logprobs"] is None
    second = [*first, reply["choices"][0]["message"], {"role": "user", "content": "more"}]
    status, reply = chat(gateway, "chain", second, logprobs=True, return_token_ids=True)
    assert status == 200 and reply["choices"][0]["message"]["content"] == "echo: more"
    assert reply["prompt_token_ids"] and reply["choices"][0]["logprobs"]["content"]  # asked for: kept

    recorded = calls(gateway, "chain")
    assert [(c["index"], c["parent"], c["segment"]) for c in recorded] == [(1, None, 1), (2, 1, 1)]
    assert recorded[1]["messages"] == second and recorded[1]["message"]["content"] == "echo: more"
    assert all(c["prompt_token_ids"] and len(c["completion_token_ids"]) == len(c["logprobs"]) > 0 for c in recorded)
    assert recorded[1]["usage"]["prompt_tokens"] == len(recorded[1]["prompt_token_ids"])
    assert recorded[0]["seconds"] > 0 and recorded[0]["finish_reason"] == "stop"

    out = calls_to_steps(recorded)
    assert [s.message["content"] for s in out.steps] == ["echo: hi", "echo: more"]
    assert out.breaks == [] and len(out.segments) == 1 and out.segments[0].turns == [1, 2]
    seg = out.segments[0]
    assert seg.prompt_ids == recorded[0]["prompt_token_ids"]
    assert seg.prompt_ids + seg.response_ids == recorded[1]["prompt_token_ids"] + recorded[1]["completion_token_ids"]
    assert 0 in seg.loss_mask and seg.loss_mask[-1] == 1  # the user's turn is not trained on, the reply is
    assert out.messages == [*second, out.steps[-1].message]


def test_a_compacted_prompt_starts_a_new_segment(gateway):
    first = [SYSTEM, {"role": "user", "content": "a long task"}]
    _, reply = chat(gateway, "compact", first)
    second = [*first, reply["choices"][0]["message"], {"role": "user", "content": "go on"}]
    _, reply = chat(gateway, "compact", second)
    compacted = [SYSTEM, {"role": "user", "content": "summary: a long task, going on"}]
    _, reply = chat(gateway, "compact", compacted)
    chat(gateway, "compact", [*compacted, reply["choices"][0]["message"], {"role": "user", "content": "next"}])

    recorded = calls(gateway, "compact")
    assert [(c["parent"], c["segment"]) for c in recorded] == [(None, 1), (1, 1), (None, 3), (3, 3)]
    out = calls_to_steps(recorded)
    assert [s.turns for s in out.segments] == [[1, 2], [3, 4]]
    assert [b.turn for b in out.breaks] == [3]

    assert http(f"{gateway.url}/rollouts/compact", method="DELETE") == (
        200, {"rollout_id": "compact", "forgotten": True})
    assert calls(gateway, "compact") == []


def test_upstream_errors_come_back_openai_shaped_with_their_status(gateway):
    status, body = chat(gateway, "fail-1", [{"role": "user", "content": "hi"}])
    assert_openai_error(status, body, 500)
    assert "injected failure" in body["error"]["message"]
    assert [(c["status"], c["message"]) for c in calls(gateway, "fail-1")] == [(500, None)]
    assert calls_to_steps(calls(gateway, "fail-1")).steps == []

    assert_openai_error(*http(f"{gateway.url}/rollouts/r/v1/chat/completions", {"messages": "hi"}), 400)
    assert_openai_error(*http(f"{gateway.url}/rollouts/r/v1/embeddings", {"input": "hi"}), 404)


def test_an_unreachable_upstream_is_a_502_in_the_same_shape():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with serve_in_thread(gateway_app(f"http://127.0.0.1:{port}/v1")) as dead:
        status, body = chat(dead, "r", [{"role": "user", "content": "hi"}])
        assert_openai_error(status, body, 502)
        assert f"127.0.0.1:{port}" in body["error"]["message"]
        assert_openai_error(*http(f"{dead.url}/rollouts/r/v1/models"), 502)


def test_memory_is_bounded_in_calls_per_rollout_and_in_rollouts(upstream):
    with serve_in_thread(gateway_app(upstream.url, max_calls_per_rollout=2, max_rollouts=2)) as small:
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(3):
            _, reply = chat(small, "long", messages)
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "again"}]
        status, body = http(f"{small.url}/rollouts/long/calls")
        assert status == 200 and body["dropped"] == 1
        assert [(c["index"], c["parent"]) for c in body["calls"]] == [(2, 1), (3, 2)]
        chat(small, "second", messages[:1])
        chat(small, "third", messages[:1])  # the least recently used rollout ("long") goes
        assert calls(small, "long") == [] and len(calls(small, "second")) == 1


def test_the_official_sdk_works_against_a_rollouts_base_url_streaming_too(gateway):
    # "task#0" is how the driver names rollouts: quoted in the URL, recorded under its own name
    client = openai.OpenAI(base_url=f"{gateway.url}/rollouts/task%230/v1", api_key="anything", max_retries=0)
    assert [m.id for m in client.models.list()] == ["scripted"]
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(model="scripted", messages=messages)
    assert reply.choices[0].message.content == "echo: hi" and "prompt_token_ids" not in (reply.model_extra or {})

    messages += [{"role": "assistant", "content": "echo: hi"}, {"role": "user", "content": "tool:src"}]
    chunks = list(client.chat.completions.create(model="scripted", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    calls_streamed = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls_streamed] == [("ls", {"path": "src"})]
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    call = calls_streamed[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "ls", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "main.py"}]
    stream = client.chat.completions.create(model="scripted", messages=messages, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: main.py"

    with pytest.raises(openai.InternalServerError):
        openai.OpenAI(base_url=f"{gateway.url}/rollouts/fail-sdk/v1", api_key="x", max_retries=0).chat.completions \
            .create(model="scripted", messages=messages)
    client.close()

    recorded = calls(gateway, "task%230")
    assert [(c["parent"], c["segment"]) for c in recorded] == [(None, 1), (1, 1), (2, 1)]
    out = calls_to_steps(recorded)
    assert out.breaks == [] and [s.turns for s in out.segments] == [[1, 2, 3]]
    assert [a.name for a in out.steps[1].actions] == ["ls"] and out.steps[1].observations[0].content == "main.py"


def external(gateway_url, **config):
    command = f"python3 -c {shlex.quote(AGENT)}"
    return ExternalAgent({"command": command, "gateway_url": gateway_url, "timeout": 60, **config})


def run(agent, env, upstream, rollout_id):
    task = Task(task_id="count", prompt="count to three")
    model = OpenAIModel(base_url=upstream.url, model="scripted")
    return asyncio.run(run_rollout(task, agent, model, env, meta=RequestMeta(rollout_id=rollout_id, task_id="count")))


def assert_three_contiguous_calls(result):
    steps = result.trajectory.steps
    assert [s.message["content"] for s in steps] == ["echo: count to three", "echo: result 0", "echo: result 1"]
    assert all(s.prompt_token_ids and s.completion_token_ids and s.logprobs for s in steps)
    assert result.metadata["token_breaks"] == [] and result.usage.completion_tokens > 0
    assert result.trajectory.messages[-1] == steps[-1].message


def test_an_external_agent_in_a_local_workspace_exit_code_and_unreachable_gateway(gateway, upstream, tmp_path):
    env = ShellEnvironment(LocalRuntime({"allow_host_exec": True, "root": str(tmp_path)}))
    result = run(external(gateway.url, env={"EXIT_CODE": "3"}), env, upstream, "local#0")
    assert result.status == "completed" and result.exit_reason.value == "natural_completion", result.error
    assert result.trajectory.exit_message.startswith("the agent's command exited with 3")
    assert_three_contiguous_calls(result)
    assert calls(gateway, "local%230") == []  # fetched, then forgotten

    env = ShellEnvironment(LocalRuntime({"allow_host_exec": True, "root": str(tmp_path)}))
    result = run(external("http://127.0.0.1:9"), env, upstream, "nowhere#0")
    assert result.status == "infra_failed" and result.exit_reason.value == "model_error"
    assert "model gateway cannot be reached" in result.error.message


@pytest.fixture(scope="module")
def bridge_gateway(base_image, upstream, docker_bridge_ip):
    """The gateway where containers on the default bridge reach the host: the host's address on that bridge."""
    with serve_in_thread(gateway_app(upstream.url), host=docker_bridge_ip) as server:
        yield server


@pytest.mark.docker
def test_an_agent_that_knows_only_openai_base_url_runs_in_a_container(bridge_gateway, upstream, base_image):
    runtime = DockerRuntime({"image": base_image, "network": "bridge"}, run_id="gateway-test", rollout_id="docker")
    result = run(external(bridge_gateway.url), ShellEnvironment(runtime), upstream, "docker#0")
    assert result.status == "completed" and result.exit_reason.value == "natural_completion", result.error
    assert result.trajectory.exit_message == "the agent's command exited with 0"
    assert_three_contiguous_calls(result)
    assert [m["role"] for m in result.trajectory.messages] == ["system", "user", "assistant", "user", "assistant",
                                                               "user", "assistant"]
