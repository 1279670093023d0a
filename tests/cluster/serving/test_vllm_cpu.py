"""The CPU vLLM tier: the tiny model (random weights, made here) through ``ray.serve.llm`` and through the
subprocess engine; exact token data in token-in and chat mode; pause/resume; weight reload. Needs the
``cpu-llm`` extra (``.ci/run`` installs it and sets ROLLOUT_REQUIRE_VLLM=1)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request

import pytest

from rollout.records import Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

PICK = [{"type": "function", "function": {"name": "pick", "description": "pick an operation", "parameters": {
    "type": "object", "properties": {"op": {"type": "string", "enum": ["add", "sub"]}}, "required": ["op"],
    "additionalProperties": False}}}]
GAME = Task(task_id="game-guess-7", prompt="Find the hidden number in as few guesses as you can.",
            data={"kind": "guess_number", "target": 7, "high": 10})


def test_the_openai_sdk_gets_a_completion_with_a_tool_call_and_token_ids(served):
    from openai import OpenAI

    client = OpenAI(base_url=served.base_url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "add or sub?"}], tools=PICK, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "pick"}}, extra_body={"return_token_ids": True},
        logprobs=True)
    choice = reply.choices[0]
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "pick"
    assert reply.model_extra["prompt_token_ids"] and choice.model_extra["token_ids"]
    assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"])


def _end_of_turn(served) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(served.section.model_source).eos_token_id


def _farm(served, token_in: bool, route: str = "completions"):
    from cluster.farm.rollout_farm import RolloutFarm

    config = {
        "model": {"type": "openai", "base_url": served.base_url, "model": "tiny", "token_in": token_in,
                  "token_in_route": route,
                  "tokenizer": served.section.model_source,  # Ray Serve LLM 2.60's /tokenize is broken
                  "return_token_ids": True, "logprobs": True,
                  # Random weights rarely end a turn: a bias on end-of-turn ends most turns within ~10 tokens, so
                  # that a rollout goes on past its first turn (its format errors fed back to it).
                  "sampling": {"max_tokens": 48, "logit_bias": {str(_end_of_turn(served)): 4.0}}},
        "agent": {"type": "text_action", "parser": "react", "max_steps": 4},
        "environment": {"type": "step", "env": "guess_number"},
        "verifier": {"type": "env_reward"},
        "farm": {"backend": "ray"},
    }
    return RolloutFarm.from_config(config, concurrency=4, name=f"tiny-{'tokens' if token_in else 'chat'}",
                                   controls=served.controls())


def _steps(batch):
    results = [r for g in batch.groups for r in g.results]
    assert results and all(r.status == "completed" for r in results), [r.error for r in results]
    return results


def test_token_in_mode_records_exact_contiguous_tokens_on_every_turn(served):
    from rollout.train.tokens import contiguity_breaks, segments

    with _farm(served, token_in=True) as farm:
        batch = farm.generate([GAME], n=3)
        results = _steps(batch)
    assert all(len(member) == 1 for group in batch.segments() for member in group)  # one sample per rollout
    multi = 0
    for result in results:
        steps = result.trajectory.steps
        multi += len(steps) > 1
        for step in steps:
            assert step.prompt_token_ids and step.completion_token_ids
            assert len(step.logprobs) == len(step.completion_token_ids)
        for before, after in zip(steps, steps[1:]):  # NeMo RL: each prompt begins with all earlier tokens
            assert after.prompt_token_ids[: len(before.prompt_token_ids) + len(before.completion_token_ids)] == \
                before.prompt_token_ids + before.completion_token_ids
        assert contiguity_breaks(steps) == [] and result.metadata["token_breaks"] == []
        assert len(segments(steps)) == 1
    assert multi, "no rollout took more than one turn: the contiguity check saw nothing"


def test_chat_mode_reports_where_the_tokens_break_and_splits_segments_there(served):
    from rollout.train.tokens import segments

    with _farm(served, token_in=False) as farm:
        results = _steps(farm.generate([GAME], n=4))
    broken = [r for r in results if r.metadata.get("token_breaks")]
    # A random model's text does not re-tokenize to the ids it sampled: chat mode breaks the stream.
    assert broken, [r.metadata for r in results]
    for result in broken:
        breaks = result.metadata["token_breaks"]
        assert all(b["turn"] >= 2 and 0 <= b["offset"] <= b["expected"] for b in breaks)
        pieces = segments(result.trajectory.steps)
        assert len(pieces) == len(breaks) + 1
        assert [p.turns[0] for p in pieces[1:]] == [b["turn"] for b in breaks]
        masked = segments(result.trajectory.steps, on_break="mask")
        assert all(set(p.loss_mask) <= {0} for p in masked[1:]) and 1 in masked[0].loss_mask


def _long_requests(base_url: str, n: int, max_tokens: int, done: list) -> None:
    """``n`` long completions at once; each appends (status, completion tokens) to ``done`` as it finishes."""
    import aiohttp

    async def one(http, i):
        body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": max_tokens, "ignore_eos": True}
        async with http.post(base_url + "/completions", json=body) as reply:
            payload = await reply.json()
            done.append((reply.status, (payload.get("usage") or {}).get("completion_tokens")))

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            await asyncio.gather(*(one(http, i) for i in range(n)))

    asyncio.run(main())


def test_pause_keep_holds_requests_and_resume_finishes_every_one(served):
    import threading

    controls, done = served.controls(), []
    worker = threading.Thread(target=_long_requests, args=(served.base_url, 16, 1900, done))
    worker.start()
    time.sleep(1.0)
    controls.pause("keep")
    time.sleep(1.0)  # what was already on its way out
    held = len(done)
    time.sleep(3.0)
    assert len(done) == held and worker.is_alive(), "requests went on finishing while the engine was paused"
    controls.resume()
    worker.join(timeout=600)
    assert len(done) == 16 and all(status == 200 and tokens == 1900 for status, tokens in done), done


def test_sleep_is_not_supported_on_the_cpu_and_says_so(served):
    from cluster.serving.controls import NotSupported

    with pytest.raises(NotSupported, match="CPU backend has no sleep mode"):
        served.controls().sleep()


def test_reloading_changed_weights_changes_the_next_completion_and_the_recorded_version(served, tiny):
    from openai import OpenAI

    client = OpenAI(base_url=served.base_url, api_key="unused", max_retries=0)

    def greedy() -> list[int]:
        reply = client.completions.create(model="tiny", prompt="ls -la", max_tokens=12, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
        return reply.choices[0].model_extra["token_ids"]

    before = greedy()
    assert greedy() == before  # greedy on the same weights is repeatable
    with _farm(served, token_in=True, route="generate") as farm:  # the engine's own label names the weights
        farm.reload_weights(tiny["b"], version=7)
        after = greedy()
        result = _steps(farm.generate([GAME], n=1))[0]
        farm.reload_weights(tiny["a"], version=8)  # back, so the module's other tests see the first weights
    assert after != before
    assert {step.policy_version for step in result.trajectory.steps} == {"7"}
    assert greedy() == before


def test_the_subprocess_engine_serves_the_same_model(served, tiny):
    from openai import OpenAI

    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    section = ServeSection(app="vllm", engine="subprocess", name="tiny-proc", route_prefix="/proc",
                           model_source=tiny["a"], cpu=True,
                           engine_kwargs=served.section.engine_kwargs, ready_timeout=600)
    model = apps.start(section, "tiny-proc", out=sys.stderr)
    try:
        client = OpenAI(base_url=model.base_url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny-proc"]
        reply = client.chat.completions.create(
            model="tiny-proc", messages=[{"role": "user", "content": "add or sub?"}], tools=PICK, max_tokens=64,
            tool_choice={"type": "function", "function": {"name": "pick"}}, extra_body={"return_token_ids": True})
        assert reply.choices[0].message.tool_calls[0].function.name == "pick"
        assert reply.choices[0].model_extra["token_ids"]
        generated = json.loads(urllib.request.urlopen(urllib.request.Request(  # vllm serve --enable-scale-out
            model.base_url[: -len("/v1")] + "/inference/v1/generate", method="POST",
            data=json.dumps({"model": "tiny-proc", "token_ids": [1, 2, 3],
                             "sampling_params": {"max_tokens": 4, "logprobs": 1}}).encode(),
            headers={"Content-Type": "application/json"}), timeout=300).read())
        assert [e["token"] for e in generated["choices"][0]["logprobs"]["content"]] == [
            f"token_id:{t}" for t in generated["choices"][0]["token_ids"]]
        model.controls().reset_prefix_cache()  # the engine's control routes answer through the recorded URL
    finally:
        model.stop()
