"""The scripted OpenAI-compatible server over real HTTP: wire format, faults, stats, policies, the serve entry."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import orjson
import pytest

from cluster.serving.scripted_server.server import ScriptedServerConfig, serve_in_thread
from rollout.models import scripted_tokens
from rollout.models.scripted import ScriptedModel
from rollout.wire.chat import is_context_length_error


@pytest.fixture(scope="module")
def server():
    config = ScriptedServerConfig(
        outputs=["first", {"tool_calls": [{"name": "ls", "arguments": {"path": "."}}]}, "third"])
    with serve_in_thread(config) as srv:
        yield srv


def http(url, body=None, method=None, headers=None):
    """(status, JSON body, headers) of one request; error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("GET" if body is None else "POST"))
    req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def chat(server, rollout_id, **body):
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"rollout_id": rollout_id},
        **body,
    }
    return http(server.url + "/chat/completions", body)


def test_health_and_models(server):
    assert http(server.root_url + "/health")[:2] == (200, {"status": "ok"})
    status, models, _ = http(server.url + "/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["scripted"]


def test_the_official_sdk_reads_replies_tool_calls_token_ids_and_logprobs(server):
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]

    def create(**kw):
        return client.chat.completions.create(
            model="scripted", messages=messages, extra_headers={"X-Rollout-Id": "sdk"}, **kw
        )

    first = create(extra_body={"return_token_ids": True}, logprobs=True)
    assert first.choices[0].message.content == "first" and first.choices[0].finish_reason == "stop"
    assert first.usage.prompt_tokens == len(scripted_tokens.prompt_token_ids(messages))
    assert first.model_extra["prompt_token_ids"] == scripted_tokens.prompt_token_ids(messages)
    assert len(first.choices[0].model_extra["token_ids"]) == len(first.choices[0].logprobs.content) > 0
    second = create()
    call = second.choices[0].message.tool_calls[0]
    assert second.choices[0].finish_reason == "tool_calls" and call.id
    assert call.function.name == "ls" and json.loads(call.function.arguments) == {"path": "."}
    assert second.choices[0].logprobs is None and "prompt_token_ids" not in (second.model_extra or {})
    client.close()


def test_outputs_replay_per_rollout_id_and_running_out_is_a_client_error(server):
    assert chat(server, "replay-a")[1]["choices"][0]["message"]["content"] == "first"
    assert chat(server, "replay-b")[1]["choices"][0]["message"]["content"] == "first"
    chat(server, "replay-a")
    assert chat(server, "replay-a")[1]["choices"][0]["message"]["content"] == "third"
    status, body, _ = chat(server, "replay-a")
    assert status == 400 and "ran out of outputs" in body["error"]["message"]


def test_failures_count_per_rollout_id_and_show_in_stats(server):
    assert http(server.root_url + "/admin/faults", {"match": "ff-", "fail_first_n": 2, "status": 503})[0] == 200
    assert http(server.root_url + "/admin/faults")[1]["fail_first_n"] == 2
    assert http(server.root_url + "/admin/stats", method="DELETE")[1]["requests"] == 0
    codes = [chat(server, rid)[0] for rid in ("ff-1", "ff-1", "ff-2", "ff-1", "ff-2", "ff-2", "other")]
    assert codes == [503, 503, 503, 200, 503, 200, 200]
    stats = http(server.root_url + "/admin/stats")[1]
    assert stats["requests"] == 7 and stats["by_status"] == {"503": 4, "200": 3} and stats["in_flight"] == 0


def test_rate_limit_sends_retry_after(server):
    http(server.root_url + "/admin/faults", {"match": "rl-", "rate_limit_first_n": 1, "retry_after": 2.5})
    status, _, headers = chat(server, "rl-1")
    assert status == 429 and headers["Retry-After"] == "2.5"
    assert chat(server, "rl-1")[0] == 200


def test_context_length_fault_uses_the_vllm_wording(server):
    http(server.root_url + "/admin/faults", {"match": "cl-", "context_length_after_tokens": 3})
    status, body, _ = chat(server, "cl-1", max_tokens=10)
    n = len(scripted_tokens.prompt_token_ids([{"role": "user", "content": "hi"}]))
    assert status == 400
    assert body["error"]["message"].startswith(
        f"This model's maximum context length is 3 tokens. However, you requested {n + 10} tokens"
    )
    assert is_context_length_error(json.dumps(body))


def test_body_limit_fault_and_the_servers_own_limit_answer_a_counted_413(server):
    http(server.root_url + "/admin/faults", {"match": "big-", "max_request_bytes": 200})
    http(server.root_url + "/admin/stats", method="DELETE")
    assert chat(server, "big-1")[0] == 200  # a short request passes
    status, body, _ = chat(server, "big-1", messages=[{"role": "user", "content": "x" * 300}])
    assert status == 413 and "over the limit of 200" in body["error"]["message"]
    status, body, _ = chat(server, "any", messages=[{"role": "user", "content": "x" * 1_100_000}])  # aiohttp's 1 MiB
    assert status == 413 and "Maximum request body size" in body["error"]["message"]
    assert http(server.root_url + "/admin/stats")[1]["by_status"] == {"200": 1, "413": 2}


def test_lone_surrogate_fault_writes_the_escape_a_strict_decoder_refuses(server):
    http(server.root_url + "/admin/faults", {"match": "ls-", "lone_surrogates": True})
    req = urllib.request.Request(server.url + "/chat/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"messages": [], "metadata": {"rollout_id": "ls-1"}}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    assert b'"first\\ud800"' in raw and json.loads(raw)["choices"][0]["message"]["content"] == "first\ud800"
    with pytest.raises(ValueError):
        orjson.loads(raw)  # what OpenAIModel's fast path refuses


def test_bad_faults_are_refused_naming_the_field(server):
    status, body, _ = http(server.root_url + "/admin/faults", {"fail_first_n": -1})
    assert status == 400 and body["error"]["message"].startswith("faults.fail_first_n")
    status, body, _ = http(server.root_url + "/admin/faults", {"fail_frist_n": 1})
    assert status == 400 and "faults.fail_frist_n: unknown key" in body["error"]["message"]


def test_a_hung_handler_ends_when_its_client_gives_up(server):
    http(server.root_url + "/admin/faults", {"match": "hang-", "hang": 60})
    req = urllib.request.Request(
        server.url + "/chat/completions",
        data=json.dumps({"messages": [], "metadata": {"rollout_id": "hang-1"}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(OSError):  # the client's timeout
        urllib.request.urlopen(req, timeout=0.3)
    deadline = time.monotonic() + 10
    while http(server.root_url + "/admin/stats")[1]["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert http(server.root_url + "/admin/stats")[1]["in_flight"] == 0


def test_bash_echo_policy_takes_three_turns_then_submits():
    with serve_in_thread(ScriptedServerConfig(policy="rollout.models.policies:bash_echo")) as srv:
        messages = [{"role": "user", "content": "fix the bug"}]
        replies = []
        for _ in range(3):
            reply = http(srv.url + "/chat/completions", {"messages": messages})[1]["choices"][0]
            assert reply["finish_reason"] == "stop" and "tool_calls" not in reply["message"]
            replies.append(reply["message"]["content"])
            messages += [reply["message"], {"role": "user", "content": "<output>ok</output>"}]
    assert "```bash\necho step 1\n```" in replies[0] and "```bash\necho step 2\n```" in replies[1]
    assert "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```" in replies[2]


def test_default_policy_echoes_the_last_user_or_tool_message():
    with serve_in_thread(ScriptedServerConfig()) as srv:
        messages = [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "x"},
            {"role": "tool", "content": "two"},
        ]
        assert (
            http(srv.url + "/chat/completions", {"messages": messages})[1]["choices"][0]["message"]["content"]
            == "echo: two"
        )


def test_a_broken_policy_is_a_counted_500():
    def broken(messages, ctx):
        raise KeyError("answer")

    with serve_in_thread(model=ScriptedModel(policy=broken)) as srv:
        status, body, _ = http(srv.url + "/chat/completions", {"messages": [{"role": "user", "content": "?"}]})
        assert status == 500 and body["error"]["message"] == "policy failed: KeyError: 'answer'"
        assert srv.stats_json()["by_status"] == {"500": 1}


def test_serve_entry_prints_its_url_and_serves_until_stopped():
    code = ("from cluster.serving.scripted_server.server import serve, ScriptedServerConfig; "
            "serve(ScriptedServerConfig(latency=0.01))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        status, body, _ = http(url + "/chat/completions", {"messages": [{"role": "user", "content": "ping"}]})
        assert status == 200 and body["choices"][0]["message"]["content"] == "echo: ping"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
