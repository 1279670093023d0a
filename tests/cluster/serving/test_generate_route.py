"""vLLM's token-in, token-out route (``POST /inference/v1/generate``) on the scripted server in process: the token ids
the policy saw are the ones sent, the reply names the weights version, vLLM's checks and errors, streaming; and
token-in mode through it gives the token stream it gives through ``/v1/completions``."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from cluster.serving.scripted_server.server import ScriptedServerConfig, serve_in_thread
from rollout.models import scripted_tokens
from rollout.models.client.model import OpenAIModel
from rollout.records import RequestMeta
from rollout.wire.generate import GENERATE_PATH, parse_generate


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(ScriptedServerConfig(policy="rollout.models.policies:bash_echo")) as srv:
        yield srv


def post(url, body):
    """(status, JSON or SSE text) of one POST; error statuses are returned, not raised."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            raw, events = reply.read().decode(), reply.headers["Content-Type"].startswith("text/event-stream")
            return reply.status, raw if events else json.loads(raw)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


TASK = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix the bug"}]


def generate(server, **fields):
    ids = scripted_tokens.prompt_token_ids(TASK)
    body = {"model": "scripted", "token_ids": ids, "sampling_params": {"max_tokens": 64, "logprobs": 2},
            "return_token_ids": True, **fields}
    return ids, post(server.root_url + GENERATE_PATH, body)


def test_the_policy_sees_the_conversation_the_ids_render_and_the_reply_is_vllms(server):
    ids, (status, reply) = generate(server, metadata={"rollout_id": "g#0", "policy_version": "7"})
    assert status == 200 and reply["prompt_token_ids"] == ids  # the ids the engine saw are the ones sent
    (choice,) = reply["choices"]
    expected = "Turn 1.\n```bash\necho step 1\n```"  # bash_echo's first turn: it read the conversation as one turn
    assert choice["token_ids"] == scripted_tokens.token_ids(expected) and choice["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(choice["token_ids"]),
                              "total_tokens": len(ids) + len(choice["token_ids"])}
    entries = choice["logprobs"]["content"]
    assert [e["token_id"] for e in entries] == choice["token_ids"]
    assert all(e["token"] == f"token_id:{e['token_id']}" and e["top_logprobs"][0]["token_id"] == e["token_id"]
               and len(e["top_logprobs"]) == 2 for e in entries)
    assert choice["weight_versions"] == [{"version": "7", "start": 0, "end": len(choice["token_ids"])}]
    got = parse_generate(reply)
    assert got.weight_version == "7" and got.text is None and got.logprobs == [e["logprob"] for e in entries]
    assert parse_generate(generate(server)[1][1]).weight_version is None  # no version asked: vLLM's "default"


def test_text_mode_carries_the_text_and_max_tokens_cuts_with_length(server):
    _, (_, full) = generate(server, output_mode="text")
    text = full["choices"][0]["text"]
    assert text.startswith("Turn 1.") and "".join(e["token"] for e in full["choices"][0]["logprobs"]["content"]) == text
    _, (_, short) = generate(server, output_mode="text", sampling_params={"max_tokens": 3})
    choice = short["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"] == "Turn 1" and len(choice["token_ids"]) == 3


def test_a_stream_is_a_chunk_per_token_whose_ids_make_the_unstreamed_reply(server):
    _, (_, whole) = generate(server)
    _, (status, events) = generate(server, stream=True, stream_options={"include_usage": True})
    chunks = [json.loads(line[len("data: "):]) for line in events.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert status == 200 and events.rstrip().endswith("data: [DONE]")
    assert [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]] == whole["choices"][0]["token_ids"]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"] and chunks[-1]["usage"] == whole["usage"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["choices"][0]["weight_versions"]


@pytest.mark.parametrize("fields, status, param", [
    ({"token_ids": []}, 400, "token_ids"),
    ({"token_ids": [1, -2]}, 400, "token_ids"),
    ({"sampling_params": "greedy"}, 400, "sampling_params"),
    ({"sampling_params": {"temperature": "hot"}}, 400, "sampling_params.temperature"),
    ({"sampling_params": {"max_tokens": 0}}, 400, "sampling_params.max_tokens"),
    ({"output_mode": "words"}, 400, "output_mode"),
    ({"model": "gpt-nope"}, 404, "model"),
])
def test_a_bad_request_is_answered_in_openais_error_shape_naming_the_field(server, fields, status, param):
    got, body = generate(server, **fields)[1]
    assert got == status and body["error"]["param"] == param and set(body["error"]) == {"message", "type", "param",
                                                                                         "code"}


def test_tokenize_renders_the_fake_template(server):
    status, reply = post(server.root_url + "/tokenize", {"model": "scripted", "messages": TASK})
    assert status == 200 and reply["tokens"] == scripted_tokens.prompt_token_ids(TASK) == generate(server)[0]
    plain = post(server.root_url + "/tokenize", {"model": "scripted", "prompt": "fix it"})[1]
    assert plain["tokens"] == scripted_tokens.token_ids("fix it")
    assert post(server.root_url + "/tokenize", {"model": "other", "prompt": "x"})[0] == 404


async def _three_turns(server, route: str) -> list:
    model = OpenAIModel(base_url=server.url, model="scripted", token_in=True, token_in_route=route)
    meta = RequestMeta(rollout_id=f"turns-{route}", task_id="t", policy_version="3")
    messages, turns = list(TASK), []
    try:
        for _ in range(3):
            response = await model.complete(messages, meta=meta)
            turns.append(response)
            messages += [response.message, {"role": "user", "content": "<output>ok</output>"}]
    finally:
        await model.aclose()
    return turns


def test_token_in_mode_gives_the_same_token_stream_through_generate_as_through_completions(server):
    by_route = {route: asyncio.run(_three_turns(server, route)) for route in ("completions", "generate")}
    same = ("prompt_token_ids", "completion_token_ids", "logprobs", "message", "finish_reason")
    for completions, generated in zip(by_route["completions"], by_route["generate"]):
        assert [getattr(completions, f) for f in same] == [getattr(generated, f) for f in same]
    turns = by_route["generate"]
    for before, after in zip(turns, turns[1:]):  # each prompt begins with every earlier token
        assert after.prompt_token_ids[: len(before.prompt_token_ids) + len(before.completion_token_ids)] == \
            before.prompt_token_ids + before.completion_token_ids
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in turns[2].message["content"]  # the policy saw each turn
    assert [t.policy_version for t in turns] == ["3"] * 3  # the weights version the reply names
    assert [t.policy_version for t in by_route["completions"]] == [None] * 3  # completions names none
