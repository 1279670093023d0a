"""The scripted policy as a Ray Serve application: the OpenAI SDK against it, OpenAI-shaped errors, sticky
routing over two replicas, and a whole SWE run through it (``serve`` section of a run config)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.serving import apps
from cluster.serving.config import ServeSection

ROOT = Path(__file__).resolve().parents[2]
DEMO_DATA = str(ROOT / "configs" / "data" / "local_demo.jsonl")
CALC_TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "evaluate arithmetic",
               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def scripted(ray_cluster):
    section = ServeSection(app="scripted", name="test-scripted", route_prefix="/scripted", policy="demo", replicas=2)
    served = apps.start(section, "scripted-demo", dataset=DEMO_DATA, out=sys.stderr)
    yield served
    served.stop()


def test_the_openai_sdk_lists_the_model_and_gets_a_tool_call(scripted):
    from openai import OpenAI

    client = OpenAI(base_url=scripted.base_url, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["scripted-demo"]
    assert client.models.retrieve("scripted-demo").id == "scripted-demo"
    reply = client.chat.completions.create(
        model="scripted-demo", tools=CALC_TOOLS,
        messages=[{"role": "user", "content": "What is (17 * 23) + 4?"}],
        metadata={"rollout_id": "tools-arithmetic#0", "task_id": "tools-arithmetic"})
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "calculate" and json.loads(call.function.arguments)["expression"]


def test_an_unknown_model_is_a_404_in_openais_error_shape_not_a_hang(scripted):
    import openai

    client = openai.OpenAI(base_url=scripted.base_url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "hi"}])
    body = caught.value.body
    assert caught.value.status_code == 404
    assert body["code"] == "model_not_found" and "gpt-nope" in body["message"] and body["type"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nope")
    bad = client.chat.completions.with_raw_response  # a body without messages: 400 with the same shape
    with pytest.raises(openai.BadRequestError) as caught:
        bad.create(model="scripted-demo", messages="hi")
    assert "messages" in caught.value.body["message"]


def _turns(base_url: str, sessions: int, turns: int) -> dict[str, list[str]]:
    """``sessions`` concurrent conversations of ``turns`` requests each; the replica that answered each turn."""
    import aiohttp

    async def one(http, sid):
        seen = []
        for _ in range(turns):
            async with http.post(base_url + "/chat/completions", headers={"x-session-id": sid}, json={
                    "model": "scripted-demo", "messages": [{"role": "user", "content": "hi"}]}) as reply:
                assert reply.status == 200
                seen.append(reply.headers["x-serve-replica"])
        async with http.post(base_url + "/sessions/release", headers={"x-session-id": "release:" + sid}) as reply:
            assert reply.status == 200
        return sid, seen

    async def main():
        async with aiohttp.ClientSession() as http:
            return dict(await asyncio.gather(*(one(http, f"s{i}") for i in range(sessions))))

    return asyncio.run(main())


def test_two_replicas_keep_each_rollout_on_one_and_share_the_rollouts(scripted):
    placed = _turns(scripted.base_url, sessions=40, turns=6)
    for sid, replicas in placed.items():
        top = collections.Counter(replicas).most_common(1)[0][1]
        assert top / len(replicas) >= 0.95, (sid, replicas)
    homes = collections.Counter(collections.Counter(r).most_common(1)[0][0] for r in placed.values())
    assert len(homes) == 2 and min(homes.values()) / len(placed) >= 0.30, homes


def test_a_swe_run_through_the_serve_hosted_scripted_model_resolves_every_instance(tmp_path):
    """The README's first command's config, in a subprocess with its own embedded cluster; `rollout eval` of
    its predictions agrees (the held-out grader is unchanged by the Serve path)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ROLLOUT_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "cluster", "run", "configs/swe_demo.yaml"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serve: 'rollout-model' answers at http://127.0.0.1:" in done.stderr
    assert "Deleting app ['rollout-model']" in done.stderr  # torn down with the run
    summary = json.loads((tmp_path / "swe_demo" / "summary.json").read_text())
    assert summary["swe"]["resolved_instances"] == summary["swe"]["total_instances"] == 12
