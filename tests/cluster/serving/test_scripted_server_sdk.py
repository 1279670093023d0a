"""The scripted server speaks OpenAI, with the official ``openai`` SDK as the client over real HTTP: streaming, ``n``
choices, 400s that name the field (and are not retried), JSON 404s, ``max_tokens``, ``top_logprobs``, text
completions, and the sampling parameters it accepts and ignores."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from cluster.serving.scripted_server.server import ScriptedServerConfig, serve_in_thread
from rollout.models import scripted_tokens
from rollout.models.client.token_in import assistant_message
from rollout.models.scripted import ScriptedModel

TOOL_REPLY = {"content": "Listing.", "tool_calls": [{"name": "ls", "arguments": {"path": "src"}},
                                                    {"name": "cat", "arguments": {"file": "a b.py"}}]}


def policy(messages, ctx):
    text = messages[-1].get("content") if messages else ""
    if text == "tool":
        return TOOL_REPLY
    if text == "seed":
        return f"seed {ctx.meta.seed}"
    return f"echo: {text}"


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(model=ScriptedModel(policy=policy)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url, api_key="unused") as sdk:  # default retries: a 400 must not be retried
        yield sdk


def chat(client, text, **kw):
    return client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": text}], **kw)


def calls(message):
    """(name, arguments) of each tool call; each call has an id of its own (a new one per reply)."""
    assert len({c.id for c in message.tool_calls or []}) == len(message.tool_calls or []) and all(
        c.id for c in message.tool_calls or [])
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("text", ["hello, streaming world", "tool"])
def test_a_stream_yields_the_text_tool_calls_and_token_data_of_the_unstreamed_reply(client, text):
    token_data = {"logprobs": True, "extra_body": {"return_token_ids": True}}
    plain = chat(client, text, **token_data)
    chunks = list(chat(client, text, stream=True, stream_options={"include_usage": True}, **token_data))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    body = [c.choices[0] for c in chunks if c.choices]
    assert "".join(ch.delta.content or "" for ch in body) == (plain.choices[0].message.content or "")
    streamed: dict[int, list] = {}
    for delta in (tc for ch in body for tc in ch.delta.tool_calls or []):
        if delta.id:  # the call's first delta: index, id, name; then its arguments piece by piece
            streamed[delta.index] = [delta.id, delta.function.name, ""]
        streamed[delta.index][2] += delta.function.arguments or ""
    assert all(call_id for call_id, _, _ in streamed.values()) and list(streamed) == list(range(len(streamed)))
    assert [(n, json.loads(a)) for _, n, a in streamed.values()] == calls(plain.choices[0].message)
    assert [ch.finish_reason for ch in body if ch.finish_reason] == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    logprobs = [e.logprob for ch in body for e in (ch.logprobs.content if ch.logprobs else [])]
    assert logprobs == [e.logprob for e in plain.choices[0].logprobs.content]
    assert [t for ch in body for t in ch.model_extra["token_ids"]] == plain.choices[0].model_extra["token_ids"]
    with client.chat.completions.stream(model="scripted", messages=[{"role": "user", "content": text}]) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.message.content == plain.choices[0].message.content
    assert calls(final.message) == calls(plain.choices[0].message)


def test_a_stream_is_server_sent_events_ending_in_done(server):
    request = urllib.request.Request(server.url + "/chat/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                      "stream": True}).encode())
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in reply.read().decode().split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "stop"


def test_n_gives_n_choices_each_under_its_own_seed_and_usage_counts_them_all(client):
    reply = chat(client, "seed", n=3, seed=7)
    assert [(c.index, c.message.content) for c in reply.choices] == [(0, "seed 7"), (1, "seed 8"), (2, "seed 9")]
    singles = [chat(client, "seed", seed=seed).usage for seed in (7, 8, 9)]
    assert reply.usage.prompt_tokens == singles[0].prompt_tokens
    assert reply.usage.completion_tokens == sum(u.completion_tokens for u in singles)
    chunks = list(chat(client, "seed", n=2, seed=1, stream=True))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in (0, 1)]
    assert texts == ["seed 1", "seed 2"]


def test_n_over_replayed_outputs_repeats_the_turn_without_skipping_the_next():
    with serve_in_thread(ScriptedServerConfig(outputs=["one", "two"])) as srv, \
            openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0) as sdk:
        first = chat(sdk, "hi", n=2)
        assert [c.message.content for c in first.choices] == ["one", "one"]
        assert chat(sdk, "hi").choices[0].message.content == "two"


BAD_CHATS = [
    ({"messages": "hi"}, "messages"),
    ({"messages": openai.NOT_GIVEN}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}, "hi"]}, "messages[1]"),
    ({"n": 0}, "n"),
    ({"n": "3"}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("fields, param", BAD_CHATS, ids=[p + "-" + str(i) for i, (_, p) in enumerate(BAD_CHATS)])
def test_an_invalid_body_is_one_400_naming_the_field_that_the_sdk_does_not_retry(server, client, fields, param):
    before = server.stats_json()["requests"]
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**body)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param and f"'{param}'" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"]
    assert server.stats_json()["requests"] == before + 1


def test_a_body_that_is_not_a_json_object_is_a_400_in_the_same_shape(server):
    for raw in (b"{not json", b"[1, 2]"):
        request = urllib.request.Request(server.url + "/chat/completions", data=raw,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 400
        assert set(json.loads(caught.value.read())["error"]) == {"message", "type", "param", "code"}


def test_unknown_routes_and_models_are_json_404s_and_the_served_model_is_retrieved(server, client):
    assert client.models.retrieve("scripted").id == "scripted"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-nope")
    assert caught.value.body["code"] == "model_not_found" and "gpt-nope" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="scripted", input="hi")
    assert "/v1/embeddings" in caught.value.body["message"] and caught.value.body["type"]
    for method, path in (("GET", "/nothing"), ("GET", "/chat/completions"), ("DELETE", "/models")):
        request = urllib.request.Request(server.url + path, method=method)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 404 and caught.value.headers["Content-Type"].startswith("application/json")
        assert path in json.loads(caught.value.read())["error"]["message"]


def test_max_tokens_cuts_the_reply_to_that_many_tokens_with_finish_reason_length(client):
    text = "a reply long enough to be cut somewhere in the middle"
    full = chat(client, text, extra_body={"return_token_ids": True})
    n = full.usage.completion_tokens
    for limit in {"max_tokens": n - 4}, {"max_completion_tokens": n - 4}:
        cut = chat(client, text, extra_body={"return_token_ids": True}, **limit)
        choice = cut.choices[0]
        assert choice.finish_reason == "length" and cut.usage.completion_tokens == n - 4
        assert full.choices[0].message.content.startswith(choice.message.content)
        assert len(choice.message.content) < len(full.choices[0].message.content)
        assert choice.model_extra["token_ids"] == full.choices[0].model_extra["token_ids"][: n - 4]
    streamed = list(chat(client, text, max_tokens=n - 4, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == cut.choices[0].message.content
    assert streamed[-1].choices[0].finish_reason == "length"
    assert chat(client, text, max_tokens=n).choices[0].finish_reason == "stop"
    tool = chat(client, "tool", max_tokens=2, logprobs=True).choices[0]  # "Listing", "."
    assert tool.finish_reason == "length" and not tool.message.tool_calls and tool.message.content == "Listing."
    assert [entry.token for entry in tool.logprobs.content] == ["Listing", "."]
    assert chat(client, "tool", max_tokens=4).choices[0].message.content.startswith("Listing.{")  # a call cut short
    for limit in range(1, 6):  # the content is the text of exactly the tokens reported
        short = chat(client, text, max_tokens=limit, logprobs=True).choices[0]
        assert "".join(entry.token for entry in short.logprobs.content) == short.message.content
        assert len(short.logprobs.content) == limit and short.message.content


def test_top_logprobs_lists_k_deterministic_alternatives_for_every_token(client):
    first, again = (chat(client, "hi there", logprobs=True, top_logprobs=3).choices[0] for _ in range(2))
    entries = first.logprobs.content
    assert entries and first.logprobs == again.logprobs
    for entry in entries:
        alternatives = [(alt.token, alt.logprob) for alt in entry.top_logprobs]
        assert len(alternatives) == 3 and (entry.token, entry.logprob) in alternatives
        assert [lp for _, lp in alternatives] == sorted((lp for _, lp in alternatives), reverse=True)
        assert all(lp <= 0 for _, lp in alternatives)
    assert all(e.top_logprobs == [] for e in chat(client, "hi", logprobs=True).choices[0].logprobs.content)


def test_text_completions_answer_a_prompt_with_token_data_tool_calls_as_hermes_text_and_16_tokens_at_most(client):
    reply = client.completions.create(model="scripted", prompt="tool", max_tokens=500, logprobs=2,
                                      extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert reply.object == "text_completion" and choice.finish_reason == "stop"
    parsed = assistant_message(choice.text, with_tools=True)
    assert parsed["content"] == "Listing."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed["tool_calls"]] == [
        (c["name"], c["arguments"]) for c in TOOL_REPLY["tool_calls"]]
    assert "".join(choice.logprobs.tokens) == choice.text
    assert len(choice.logprobs.token_logprobs) == len(choice.model_extra["token_ids"]) == reply.usage.completion_tokens
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    streamed = list(client.completions.create(model="scripted", prompt="tool", max_tokens=500, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == choice.text
    long = client.completions.create(model="scripted", prompt="a prompt echoed back well past sixteen tokens, "
                                     "which is what a completion gets when it does not ask for more")
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 16
    two = client.completions.create(model="scripted", prompt="hi", n=2)
    assert [(c.index, c.text) for c in two.choices] == [(0, "echo: hi"), (1, "echo: hi")]
    ids = scripted_tokens.prompt_token_ids([{"role": "user", "content": "from ids"}])  # a token-id prompt
    by_ids = client.completions.create(model="scripted", prompt=ids, extra_body={"return_token_ids": True})
    assert by_ids.choices[0].text == "echo: from ids" and by_ids.choices[0].model_extra["prompt_token_ids"] == ids
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="scripted", prompt=[101, "x"])
    assert caught.value.body["param"] == "prompt"


def test_parameters_it_does_not_model_are_accepted_and_ignored(client):
    plain = chat(client, "same answer")
    tuned = chat(client, "same answer", temperature=0.3, top_p=0.9, seed=1, user="someone", stop=["\n"],
                 presence_penalty=0.5, frequency_penalty=0.1, logit_bias={"42": 1}, response_format={"type": "text"},
                 store=False, service_tier="auto", reasoning_effort="low", parallel_tool_calls=True,
                 tool_choice="auto", tools=[{"type": "function", "function": {"name": "noop", "parameters": {}}}],
                 stream_options=None, extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1})
    assert tuned.choices[0].message.content == plain.choices[0].message.content == "echo: same answer"
