"""vLLM's token-in, token-out route (``POST /inference/v1/generate``) on the vLLM app (the tiny CPU model through
``ray.serve.llm``, whose ingress lacks the route: ``cluster/serving/generate_route.py`` passes it through): the
ids sent are the ids the engine saw, the reply names the weights' label, token-in mode through it gives the stream
it gives through ``/v1/completions``; and a client we did not write, the ``renderers`` package's generate client
(what verifiers 0.4's training client calls), against it.

``renderers`` is not in our venv: the session fixture ``renderers_python`` gives the python of a venv of its own
(``tests/foreign_venvs.py``); where it cannot be built (no package index) its test skips, or fails with
ROLLOUT_REQUIRE_RENDERERS=1 (as in CI)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from foreign_venvs import run_function

from rollout.wire.generate import GENERATE_PATH, parse_generate

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

ASK = [{"role": "user", "content": "add or sub?"}]


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            raw, events = reply.read().decode(), reply.headers["Content-Type"].startswith("text/event-stream")
            return reply.status, raw if events else json.loads(raw)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def root(served) -> str:
    return served.base_url[: -len("/v1")]


def chat_ids(served, messages=ASK) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.section.model_source)
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def generate(served, ids, **fields):
    body = {"model": "tiny", "token_ids": ids, "return_token_ids": True,
            "sampling_params": {"max_tokens": 8, "temperature": 0, "logprobs": 1}, **fields}
    return post(root(served) + GENERATE_PATH, body, {"x-session-id": "generate-test"})


def test_the_engine_sees_the_ids_sent_and_answers_what_completions_answers(served):
    ids = chat_ids(served)
    status, reply = generate(served, ids)
    assert status == 200 and reply["prompt_token_ids"] == ids
    (choice,) = reply["choices"]
    entries = choice["logprobs"]["content"]
    assert 0 < len(choice["token_ids"]) <= 8 and [e["token_id"] for e in entries] == choice["token_ids"]
    assert all(e["token"] == f"token_id:{e['token_id']}" for e in entries)  # the placeholder earlier clients check
    assert choice["weight_versions"][0]["start"] == 0 and choice["weight_versions"][-1]["end"] == len(entries)
    status, completion = post(served.base_url + "/completions", {
        "model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True})
    assert completion["choices"][0]["token_ids"] == choice["token_ids"]  # greedy: the same engine, the same ids
    served.controls().set_weight_version("9")
    assert parse_generate(generate(served, ids)[1]).weight_version == "9"  # the reply names the weights' label
    status, events = generate(served, ids, stream=True)
    chunks = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    assert [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]] == choice["token_ids"]
    assert all("token" in e for c in chunks for ch in c["choices"] for e in (ch["logprobs"] or {}).get("content", []))


@pytest.mark.parametrize("fields, status, param", [
    ({"token_ids": []}, 400, "token_ids"),
    ({"sampling_params": {"temperature": "hot"}}, 400, "sampling_params"),
    ({"model": "gpt-nope"}, 404, "model"),
])
def test_a_bad_request_is_answered_in_openais_error_shape(served, fields, status, param):
    got, body = generate(served, chat_ids(served), **fields)
    assert got == status and body["error"]["param"] == param and body["error"]["message"]


async def _turns(served, route: str) -> list:
    from rollout.models.client.model import OpenAIModel
    from rollout.records import RequestMeta

    model = OpenAIModel(base_url=served.base_url, model="tiny", token_in=True, token_in_route=route,
                        tokenizer=served.section.model_source, sampling={"max_tokens": 12, "temperature": 0})
    messages, turns = list(ASK), []
    try:
        for _ in range(3):
            response = await model.complete(messages, meta=RequestMeta(rollout_id=f"route-{route}", task_id="t"))
            turns.append(response)
            messages += [response.message, {"role": "user", "content": "<output>ok</output>"}]
    finally:
        await model.aclose()
    return turns


def test_token_in_mode_gives_the_same_token_stream_through_generate_as_through_completions(served):
    served.controls().set_weight_version("11")
    by_route = {route: asyncio.run(_turns(served, route)) for route in ("completions", "generate")}
    for completions, generated in zip(by_route["completions"], by_route["generate"]):
        assert generated.prompt_token_ids == completions.prompt_token_ids
        assert generated.completion_token_ids == completions.completion_token_ids
        assert generated.message == completions.message and generated.finish_reason == completions.finish_reason
        assert generated.logprobs == pytest.approx(completions.logprobs, abs=1e-3)
    turns = by_route["generate"]
    for before, after in zip(turns, turns[1:]):
        assert after.prompt_token_ids[: len(before.prompt_token_ids) + len(before.completion_token_ids)] == \
            before.prompt_token_ids + before.completion_token_ids
    assert [t.policy_version for t in turns] == ["11"] * 3 and by_route["completions"][0].policy_version is None


# ---- renderers' own client, in a venv of its own ------------------------------------------------------------------


def call_renderers(request: dict) -> dict:
    """Runs in the renderers venv: its ``generate`` renders the chat with the model's tokenizer and POSTs the ids;
    the bodies it sent are caught on the wire."""
    import asyncio
    import json

    import httpx
    from openai import AsyncOpenAI
    from renderers import create_renderer
    from renderers.base import load_tokenizer
    from renderers.client import generate

    sent = []

    async def catch(wire_request):
        if wire_request.url.path.endswith("/inference/v1/generate"):
            sent.append(json.loads(wire_request.content))

    async def go():
        http = httpx.AsyncClient(event_hooks={"request": [catch]}, timeout=300)
        client = AsyncOpenAI(base_url=request["base_url"], api_key="unused", max_retries=0, http_client=http)
        renderer = create_renderer(load_tokenizer(request["tokenizer"]))
        result = await generate(client=client, renderer=renderer, messages=request["messages"], model=request["model"],
                                sampling_params={"max_tokens": 8, "temperature": 0},
                                extra_headers={"X-Session-ID": "renderers-0"})
        await client.close()
        return result

    result = asyncio.run(go())
    keys = ("prompt_ids", "completion_ids", "completion_logprobs", "content", "finish_reason")
    return {"sent": sent, **{key: result[key] for key in keys}}


def test_renderers_generate_client_sends_ids_the_engine_sees_and_reads_the_reply(served, renderers_python, tmp_path):
    ask = {"base_url": served.base_url, "model": "tiny", "tokenizer": served.section.model_source, "messages": ASK}
    answer = run_function(renderers_python, call_renderers, ask, cwd=tmp_path, timeout=600)
    (body,) = answer["sent"]
    assert body["token_ids"] == answer["prompt_ids"] == chat_ids(served)  # its rendering is the model's template
    # the engine, given the very body the client sent (asking for the ids it saw), saw those ids and sampled the
    # completion the client read
    status, seen = post(root(served) + GENERATE_PATH, {**body, "return_token_ids": True})
    assert status == 200 and seen["prompt_token_ids"] == body["token_ids"]
    assert seen["choices"][0]["token_ids"] == answer["completion_ids"]
    assert len(answer["completion_logprobs"]) == len(answer["completion_ids"]) > 0
