"""vLLM's token-in, token-out route (``POST /inference/v1/generate``) on the vLLM app (the tiny CPU model through
``ray.serve.llm``, whose ingress lacks the route: ``cluster/serving/generate_route.py`` passes it through): the
ids sent are the ids the engine saw, the reply names the weights' label, token-in mode through it gives the stream
it gives through ``/v1/completions``; and a client we did not write, the ``renderers`` package's generate client
(what verifiers 0.4's training client calls), against it.

``renderers`` is not in our venv: the ``renderers_python`` fixture builds a venv of its own under pytest's cache
directory (or ``$ROLLOUT_RENDERERS_VENV``), reused while it imports; where it cannot be built (no package index)
its test skips, or fails with ROLLOUT_REQUIRE_RENDERERS=1 (as in CI)."""

from __future__ import annotations

import asyncio
import fcntl
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rollout.wire.generate import GENERATE_PATH, parse_generate

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

RENDERERS = ["renderers==0.1.12", "transformers==5.24.0", "httpx==0.28.1"]
"""renderers imports httpx without declaring it; transformers loads the tiny model's tokenizer (no torch needed)."""
PROBE = "import renderers.client, transformers"
MARK = "@@renderers-answer@@ "
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


def build_venv(path: Path) -> Path:
    """The venv at ``path``, reused when it holds ``RENDERERS`` and imports, else built again; its python."""
    python, ready = path / "bin" / "python", path / "rollout-farm-ready.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe = subprocess.run([str(python), "-c", PROBE], capture_output=True) if python.exists() else None
        if ready.exists() and json.loads(ready.read_text()) == RENDERERS and probe and probe.returncode == 0:
            return python
        shutil.rmtree(path, ignore_errors=True)
        for step in ([sys.executable, "-m", "venv", str(path)],
                     [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *RENDERERS],
                     [str(python), "-c", PROBE]):
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(step[:4])} failed: {(done.stdout + done.stderr)[-2000:]}")
        ready.write_text(json.dumps(RENDERERS))
    return python


@pytest.fixture(scope="session")
def renderers_python(pytestconfig, tmp_path_factory) -> Path:
    cache = getattr(pytestconfig, "cache", None)
    path = (cache.mkdir("renderers-0.1.12") if cache is not None else tmp_path_factory.mktemp("renderers")) / "venv"
    try:
        return build_venv(Path(os.environ.get("ROLLOUT_RENDERERS_VENV") or path))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        if os.environ.get("ROLLOUT_REQUIRE_RENDERERS", "") not in ("", "0", "false", "no"):
            pytest.fail(f"no renderers venv: {error}")
        pytest.skip(f"no renderers venv: {error} (set ROLLOUT_REQUIRE_RENDERERS=1 to make this an error)")


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
    code = (textwrap.dedent(inspect.getsource(call_renderers)) + "\nimport json, sys\n"
            f"print({MARK!r} + json.dumps(call_renderers(json.loads(sys.stdin.read()))))\n")
    ask = {"base_url": served.base_url, "model": "tiny", "tokenizer": served.section.model_source, "messages": ASK}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(renderers_python), "-c", code], input=json.dumps(ask), capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    answer = next((json.loads(line[len(MARK):]) for line in done.stdout.splitlines() if line.startswith(MARK)), None)
    assert answer is not None, done.stderr[-4000:]
    (body,) = answer["sent"]
    assert body["token_ids"] == answer["prompt_ids"] == chat_ids(served)  # its rendering is the model's template
    # the engine, given the very body the client sent (asking for the ids it saw), saw those ids and sampled the
    # completion the client read
    status, seen = post(root(served) + GENERATE_PATH, {**body, "return_token_ids": True})
    assert status == 200 and seen["prompt_token_ids"] == body["token_ids"]
    assert seen["choices"][0]["token_ids"] == answer["completion_ids"]
    assert len(answer["completion_logprobs"]) == len(answer["completion_ids"]) > 0
