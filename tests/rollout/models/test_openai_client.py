"""OpenAIModel against the real scripted server on 127.0.0.1: round trips, retries, typed errors, load."""

from __future__ import annotations

import asyncio
import email.utils
import json
import pickle
import socket
import time
import urllib.request

import pytest

from cluster.serving.scripted_server.server import ScriptedServerConfig, fake_server, serve_in_thread
from rollout.errors import ConfigError, ContextLengthExceeded, ModelError, TokenLimitExceeded
from rollout.models import scripted_tokens
from rollout.models.client.model import OpenAIModel, OpenAIModelConfig
from rollout.models.scripted import ScriptedModel
from rollout.protocols import Model
from rollout.records import RequestMeta
from rollout.wire.chat import parse_retry_after


def route(messages, ctx):
    """Calls the first offered tool, then reports its result; without tools, says who asked."""
    last = messages[-1]
    if ctx.tools:
        if last["role"] == "tool":
            return f"tool {last['tool_call_id']} said {last['content']}"
        return {"tool_calls": [{"name": ctx.tools[0]["function"]["name"], "arguments": {"a": 1, "b": 2}}]}
    return f"rollout={ctx.meta.rollout_id} task={ctx.meta.task_id} attempt={ctx.meta.attempt}: {last['content']}"


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(ScriptedServerConfig(), model=ScriptedModel(policy=route)) as srv:
        yield srv


def admin(server, path, body=None):
    method = "GET" if body is None else "POST"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.root_url + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def statuses(server):
    return admin(server, "/admin/stats")["by_status"]


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def model_for(server, **fields):
    return OpenAIModel(OpenAIModelConfig(base_url=server.url, model="scripted", backoff=0.01, **fields))


def ask(model, text="hi", rollout_id="r", **kw):
    async def go():
        try:
            return await model.complete(
                [{"role": "user", "content": text}], meta=RequestMeta(rollout_id=rollout_id), **kw
            )
        finally:
            await model.aclose()

    return asyncio.run(go())


def test_matches_the_model_protocol(server):
    assert isinstance(model_for(server), Model)


def test_tool_calls_round_trip(server):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    model = model_for(server, tool_choice="auto")

    async def go():
        messages = [{"role": "user", "content": "add 1 and 2"}]
        first = await model.complete(messages, tools, meta=RequestMeta(rollout_id="tools-1"))
        call = first.message["tool_calls"][0]
        messages += [first.message, {"role": "tool", "tool_call_id": call["id"], "content": "3"}]
        second = await model.complete(messages, tools, meta=RequestMeta(rollout_id="tools-1"))
        await model.aclose()
        return first, second

    first, second = asyncio.run(go())
    call = first.message["tool_calls"][0]
    assert first.finish_reason == "tool_calls"
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    assert second.message == {"role": "assistant", "content": f"tool {call['id']} said 3"}
    assert second.finish_reason == "stop" and second.usage.prompt_tokens > first.usage.prompt_tokens > 0


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_retried_until_success(server, status):
    admin(server, "/admin/faults", {"match": f"flaky-{status}", "fail_first_n": 2, "status": status})
    before = statuses(server)
    response = ask(model_for(server, max_retries=3), "still there?", rollout_id=f"flaky-{status}")
    assert response.message["content"].endswith("still there?")
    assert delta(before, statuses(server)) == {str(status): 2, "200": 1}


def test_gives_up_after_bounded_retries_naming_endpoint_status_and_body(server):
    admin(server, "/admin/faults", {"match": "down", "fail_first_n": 100, "status": 502})
    before = statuses(server)
    with pytest.raises(ModelError) as err:
        ask(model_for(server, max_retries=2), rollout_id="down")
    assert err.value.retryable
    assert server.url in str(err.value) and "3 attempt" in str(err.value)
    assert "HTTP 502" in str(err.value) and "injected failure" in str(err.value)
    assert delta(before, statuses(server)) == {"502": 3}


def test_rate_limit_waits_for_retry_after(server):
    admin(server, "/admin/faults", {"match": "limited", "rate_limit_first_n": 1, "retry_after": 1})
    t0 = time.perf_counter()
    response = ask(model_for(server, max_retries=1), rollout_id="limited")
    assert time.perf_counter() - t0 >= 1.0
    assert response.message["content"].startswith("rollout=limited")


def test_a_hung_request_becomes_a_model_error_after_bounded_retries(server):
    admin(server, "/admin/faults", {"match": "hung", "hang": 60})
    before = admin(server, "/admin/stats")["requests"]
    with pytest.raises(ModelError) as err:
        ask(model_for(server, timeout=0.3, max_retries=1), rollout_id="hung")
    assert err.value.retryable and "2 attempt" in str(err.value) and "Timeout" in str(err.value)
    assert admin(server, "/admin/stats")["requests"] - before == 2


def test_context_length_400_is_a_token_limit_outcome_not_retried(server):
    admin(server, "/admin/faults", {"match": "long", "context_length_after_tokens": 5})
    before = statuses(server)
    with pytest.raises(ContextLengthExceeded) as err:
        ask(model_for(server), "a prompt that is much longer than five tokens", rollout_id="long")
    assert isinstance(err.value, TokenLimitExceeded)
    assert "maximum context length is 5 tokens" in str(err.value)
    assert delta(before, statuses(server)) == {"400": 1}


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_client_errors_are_not_retried(server, status):
    admin(server, "/admin/faults", {"match": f"bad-{status}", "fail_first_n": 5, "status": status})
    before = statuses(server)
    with pytest.raises(ModelError) as err:
        ask(model_for(server), rollout_id=f"bad-{status}")
    assert not err.value.retryable and not isinstance(err.value, ContextLengthExceeded)
    assert f"HTTP {status}" in str(err.value)
    assert delta(before, statuses(server)) == {str(status): 1}


def test_unreachable_endpoint_is_a_retryable_model_error():
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIModel(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff=0.01)
    with pytest.raises(ModelError) as err:
        ask(model)
    assert err.value.retryable and f"127.0.0.1:{port}" in str(err.value)


@pytest.mark.parametrize("token_data", [True, False])
def test_token_ids_and_logprobs(server, token_data):
    messages = [{"role": "user", "content": "count my tokens"}]
    model = model_for(server, return_token_ids=token_data, logprobs=token_data)
    response = ask(model, messages[0]["content"])
    if not token_data:
        assert response.prompt_token_ids is None and response.completion_token_ids is None and response.logprobs is None
        return
    assert response.prompt_token_ids == scripted_tokens.prompt_token_ids(messages)
    assert response.completion_token_ids == scripted_tokens.token_ids(scripted_tokens.render_reply(response.message))
    assert len(response.logprobs) == len(response.completion_token_ids) == response.usage.completion_tokens
    assert all(-3 < lp <= 0 for lp in response.logprobs)


def test_metadata_reaches_the_policy_which_finds_the_task_in_the_dataset(tmp_path):
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text(
        '{"task_id": "t1", "data": {"answer": "forty-two"}}\n{"task_id": "t2", "data": {"answer": "7"}}\n'
    )
    config = ScriptedServerConfig(policy="rollout.models.policies:oracle", dataset=str(dataset))

    async def go():
        async with fake_server(config) as srv:
            model = OpenAIModel(base_url=srv.url)
            answers = []
            for task_id in ("t2", "t1", "t9"):
                meta = RequestMeta(rollout_id=f"{task_id}#0", task_id=task_id, sample_index=0)
                answers.append((await model.complete([{"role": "user", "content": "?"}], meta=meta)).message["content"])
            await model.aclose()
            return answers

    assert asyncio.run(go()) == ["7", "forty-two", "unknown task 't9'"]


def test_without_body_metadata_the_rollout_id_still_travels_in_a_header(server):
    model = model_for(server, send_metadata=False)
    meta = RequestMeta(rollout_id="hdr-1", task_id="t1", attempt=3)
    body = model.request_body([{"role": "user", "content": "x"}], None, meta, {})
    assert "metadata" not in body
    response = asyncio.run(model.complete([{"role": "user", "content": "x"}], meta=meta))
    assert response.message["content"] == "rollout=hdr-1 task= attempt=1: x"
    with_metadata = asyncio.run(model_for(server).complete([{"role": "user", "content": "x"}], meta=meta))
    assert with_metadata.message["content"] == "rollout=hdr-1 task=t1 attempt=3: x"


def test_request_body_merges_sampling_defaults_call_arguments_and_extra_body():
    model = OpenAIModel(sampling={"temperature": 0.7, "max_tokens": 64, "seed": 1}, extra_body={"top_k": 20}, model="m")
    body = model.request_body([], None, None, {"temperature": 0.0, "seed": None})
    assert body == {"model": "m", "messages": [], "temperature": 0.0, "max_tokens": 64, "top_k": 20}


def test_one_model_serves_several_event_loops_in_turn(server):
    model = model_for(server)
    for i in range(3):  # no aclose: the session is closed when its loop ends
        assert (
            asyncio.run(model.complete([{"role": "user", "content": f"run {i}"}]))
            .message["content"]
            .endswith(f"run {i}")
        )


def test_a_used_client_pickles_and_the_copy_makes_its_own_session(server):
    model = model_for(server)
    assert asyncio.run(model.complete([{"role": "user", "content": "a"}])).message["content"].endswith("a")
    copy = pickle.loads(pickle.dumps(model))
    assert asyncio.run(copy.complete([{"role": "user", "content": "b"}])).message["content"].endswith("b")


def test_config_rejects_unknown_keys_and_reads_the_api_key_from_the_environment(monkeypatch):
    with pytest.raises(ConfigError) as err:
        OpenAIModel.from_config({"base_url": "http://x/v1", "temprature": 0.5})
    assert err.value.field == "model.temprature"
    monkeypatch.setenv("MY_KEY", "sk-test")
    assert OpenAIModel(api_key_env="MY_KEY")._headers["Authorization"] == "Bearer sk-test"
    assert "sk-test" not in repr(OpenAIModelConfig(api_key="sk-test"))


def test_retry_after_accepts_seconds_and_http_dates():
    assert parse_retry_after("2") == 2.0
    assert 9 <= parse_retry_after(email.utils.formatdate(time.time() + 10, usegmt=True)) <= 10
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_two_thousand_concurrent_requests_through_one_client():
    n, latency = 2000, 0.5
    with serve_in_thread(ScriptedServerConfig(latency=latency)) as srv:
        model = OpenAIModel(base_url=srv.url, timeout=60)

        async def go():
            messages = [[{"role": "user", "content": f"request {i}"}] for i in range(n)]
            t0 = time.perf_counter()
            out = await asyncio.gather(
                *(model.complete(m, meta=RequestMeta(rollout_id=f"c{i}")) for i, m in enumerate(messages))
            )
            wall = time.perf_counter() - t0
            await model.aclose()
            return out, wall

        responses, wall = asyncio.run(go())
        stats = srv.stats_json()
    print(
        f"\n{n} concurrent requests at {latency}s latency: {wall:.2f}s wall, {stats['max_in_flight']} in flight at peak"
    )
    assert [r.message["content"] for r in responses] == [f"echo: request {i}" for i in range(n)]
    assert stats["by_status"] == {"200": n}
    assert stats["max_in_flight"] > n // 2  # held together, not trickled through a small pool
    assert wall < 30


@pytest.mark.parametrize("client", ["auto", "aiohttp"])
def test_a_reply_with_lone_surrogate_escapes_is_read_with_replacement_characters_not_retried(client):
    # What a JSON encoder writes for broken text ("\ud800"): the model's reply, not an outage.
    async def go():
        async with fake_server(ScriptedServerConfig(outputs=["half a character: \ud800 then more"])) as srv:
            model = OpenAIModel(base_url=srv.url, http_client=client, backoff=0.01)
            reply = await model.complete([{"role": "user", "content": "hi"}], meta=RequestMeta(rollout_id="s"))
            await model.aclose()
            return reply, srv.stats_json()["by_status"]

    reply, by_status = asyncio.run(go())
    assert reply.message["content"] == "half a character: \ufffd then more"
    assert by_status == {"200": 1}, "one request: a reply that decodes with replacement is not retried"


async def raw_reply_server(body: bytes, status: int = 200) -> tuple[asyncio.AbstractServer, str, list[int]]:
    """Answers every request with ``body`` as an application/json reply with ``status``, counting requests."""
    requests: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            requests.append(1)
            writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (status, len(body), body))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", requests


def test_a_reply_with_invalid_utf8_is_read_with_replacement_characters_not_retried():
    body = b'{"choices": [{"message": {"role": "assistant", "content": "cut \xe2\x82 short"}}]}'

    async def go():
        server, url, requests = await raw_reply_server(body)
        model = OpenAIModel(base_url=url, backoff=0.01)
        try:
            return await model.complete([{"role": "user", "content": "hi"}]), len(requests)
        finally:
            await model.aclose()
            server.close()

    reply, requests = asyncio.run(go())
    assert reply.message["content"] == "cut \ufffd short" and requests == 1


def test_a_history_over_the_servers_body_limit_is_the_token_limit_not_an_infra_failure(server):
    # aiohttp (the scripted server) refuses bodies over 1 MiB with 413, as a proxy in front of vLLM would at its own
    # limit: the conversation has outgrown what the server takes, as with a context-length 400.
    before = statuses(server)
    with pytest.raises(ContextLengthExceeded) as err:
        ask(model_for(server), "z" * 1_100_000, rollout_id="huge")
    assert isinstance(err.value, TokenLimitExceeded)
    assert "HTTP 413" in str(err.value) and "body limit" in str(err.value)
    assert delta(before, statuses(server)) == {"413": 1}, "refused once, not retried"


@pytest.mark.parametrize("message", [
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, "
    "1000 in the completion). Please reduce the length of the messages or completion.",
    "The decoder prompt (length 5951) is longer than the maximum model length of 4096. Make sure that "
    "`max_model_len` is no smaller than the number of text tokens.",
    "The prompt (total length 25938) is too long to fit into the model (context length 4096). Make sure that "
    "`max_model_len` is no smaller than the number of text tokens.",
    "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
], ids=["vllm-openai", "vllm-decoder-prompt", "vllm-prompt-total", "sglang"])
def test_context_length_rejections_as_vllm_and_sglang_word_them_are_the_token_limit(message):
    body = json.dumps({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}})

    async def go():
        server, url, requests = await raw_reply_server(body.encode(), 400)
        model = OpenAIModel(base_url=url, backoff=0.01)
        try:
            await model.complete([{"role": "user", "content": "hi"}])
        except BaseException as exc:  # noqa: BLE001 - the test looks at which
            return exc, len(requests)
        finally:
            await model.aclose()
            server.close()
        return None, len(requests)

    error, requests = asyncio.run(go())
    assert isinstance(error, ContextLengthExceeded), error
    assert requests == 1


def test_a_request_carries_its_session_and_policy_version_and_salts_the_cache_only_when_asked():
    from rollout.models.client.model import OpenAIModel
    from rollout.records import RequestMeta

    meta = RequestMeta(rollout_id="t#0", task_id="t", policy_version="7")
    plain = OpenAIModel(base_url="http://127.0.0.1:9/v1", model="m")
    salted = OpenAIModel(base_url="http://127.0.0.1:9/v1", model="m", cache_salt=True)
    assert plain._request_headers(meta)["x-session-id"] == "t#0"  # Serve's session header: the rollout
    assert plain.request_body([], None, meta, {})["metadata"]["policy_version"] == "7"
    assert "cache_salt" not in plain.request_body([], None, meta, {})  # hosted APIs refuse unknown fields
    assert salted.request_body([], None, meta, {})["cache_salt"] == "policy-7"
    assert "cache_salt" not in salted.request_body([], None, RequestMeta(rollout_id="t#0"), {})
