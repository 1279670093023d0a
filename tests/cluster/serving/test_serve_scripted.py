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

ROOT = Path(__file__).resolve().parents[3]
CALC_TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "evaluate arithmetic",
               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


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


def test_the_generate_route_answers_on_serve_with_the_ids_sent_the_version_asked_and_a_sticky_replica(scripted):
    """vLLM's token-in route through Serve's proxy and the sticky router: each session's turns on one replica."""
    import aiohttp

    from rollout.models import scripted_tokens
    from rollout.wire.generate import GENERATE_PATH

    root = scripted.base_url[: -len("/v1")]

    async def one(http, sid):
        seen, ids = [], scripted_tokens.prompt_token_ids([{"role": "user", "content": f"session {sid}"}])
        for turn in range(4):
            body = {"model": "scripted-demo", "token_ids": ids, "return_token_ids": True,
                    "sampling_params": {"max_tokens": 16, "logprobs": 0},
                    "metadata": {"rollout_id": sid, "task_id": "tools-arithmetic", "policy_version": "5"}}
            async with http.post(root + GENERATE_PATH, headers={"x-session-id": sid}, json=body) as reply:
                assert reply.status == 200, await reply.text()
                data = await reply.json()
                seen.append(reply.headers["x-serve-replica"])
            choice = data["choices"][0]
            assert data["prompt_token_ids"] == ids and choice["weight_versions"][0]["version"] == "5"
            assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) > 0
            ids = ids + choice["token_ids"] + scripted_tokens.prompt_token_ids([{"role": "tool", "content": "ok"}])
        return seen

    async def main():
        async with aiohttp.ClientSession() as http:
            return await asyncio.gather(*(one(http, f"gen-{i}") for i in range(12)))

    placed = asyncio.run(main())
    assert all(len(set(replicas)) == 1 for replicas in placed), placed
    assert len({replicas[0] for replicas in placed}) == 2  # new sessions go to the replica with fewer


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
    runtime = "docker" if "runtime: docker" in done.stderr else "local"
    graded = subprocess.run([sys.executable, "-m", "cluster", "eval", "--dataset",
                             str(ROOT / "runs" / "datasets" / "swe_mini" / "swe_mini.jsonl"), "--predictions",
                             str(tmp_path / "swe_demo" / "preds.json"), "--run-id", "regrade", "--runtime", runtime],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert graded.returncode == 0, graded.stderr[-3000:]
    report = json.loads(next((tmp_path / "regrade").glob("*.regrade.json")).read_text())
    assert report["resolved_instances"] == 12 and report["unresolved_instances"] == 0


def test_a_farm_with_a_serve_section_deploys_runs_stamps_versions_and_says_what_it_cannot_do(ray_cluster):
    from ray import serve

    from cluster.farm.rollout_farm import RolloutFarm
    from cluster.serving.controls import NotSupported
    from rollout.records import Task

    config = {
        "serve": {"app": "scripted", "name": "farm-scripted", "route_prefix": "/farm", "policy": "bash_echo"},
        "model": {"type": "openai", "model": "scripted-bash"},
        "agent": {"type": "mini_swe", "max_steps": 5},
        "environment": {"type": "shell"},
        "runtime": {"type": "local"},
        "farm": {"backend": "ray"},
    }
    task = Task(task_id="echo-task", prompt="echo twice, then submit")
    with RolloutFarm.from_config(config, concurrency=4, name="serve-farm") as farm:
        first = [r for g in farm.generate([task], n=2).groups for r in g.results]
        farm.set_policy_version(5)
        farm.pause("keep")  # a scripted policy has nothing to pause: the farm's gate does it
        farm.resume()
        second = [r for g in farm.generate([task], n=1).groups for r in g.results]
        for call in (lambda: farm.reload_weights("/checkpoints/1", version=6), farm.sleep):
            with pytest.raises(NotSupported):
                call()
        assert "farm-scripted" in serve.status().applications
    assert all(r.status == "completed" and r.exit_reason.value == "submitted" for r in first + second)
    assert all(len(r.trajectory.steps) == 3 for r in first + second)
    assert {s.policy_version for s in second[0].trajectory.steps} == {"5"}
    assert "farm-scripted" not in serve.status().applications  # deleted with the farm


def test_rollout_serve_prints_the_base_url_and_serves_until_interrupted(tmp_path):
    import signal
    import urllib.request

    from cluster.serving.apps import free_port

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    port, log = free_port(), tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "cluster", "serve", "configs/swe_demo.yaml", "--port", str(port),
                             "serve.name=cli"], cwd=ROOT, env={**env, "ROLLOUT_HOME": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1", (url, log.read_text()[-3000:])
        with urllib.request.urlopen(url + "/models", timeout=30) as reply:
            assert json.loads(reply.read())["data"][0]["id"] == "scripted-gold"
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the application is deleted, the embedded cluster ends
        assert proc.wait(timeout=120) == 0
        assert "serve: deleting 'cli'" in log.read_text()
        # it started Serve with its options: nothing says they were not applied (Ray logs so at every deploy)
        text = log.read_text()
        assert "will not be applied" not in text and "not applied" not in text and "Started Serve" in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the CLI and the Ray processes it started
            proc.wait(timeout=30)


def test_rollout_serve_without_a_serve_section_is_a_config_error(tmp_path):
    config = tmp_path / "no_serve.yaml"
    config.write_text("model: {type: openai, model: m, base_url: 'http://127.0.0.1:9/v1'}\n"
                      "dataset: {path: tasks.jsonl}\n")
    done = subprocess.run([sys.executable, "-m", "cluster", "serve", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no serve section" in done.stderr


def test_rollout_serve_on_a_running_serve_says_which_option_it_did_not_take(ray_cluster, tmp_path):
    """Serve already runs on the cluster, its proxies on one port: ``rollout serve --port OTHER`` deploys there,
    prints the URL on Serve's port, and says in one line that its port was not applied (and nothing else does)."""
    import io

    from ray import serve

    from cluster.session.ray_private import serve_http_config
    from cluster.session.serve_instance import start_serve

    start_serve("127.0.0.1", apps.free_port(), asked={}, out=io.StringIO())  # as a run before left it
    running, other = serve_http_config(), apps.free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "token",
                                                                        "ROLLOUT_HOME": str(tmp_path)}
    try:
        done = subprocess.run([sys.executable, "-m", "cluster", "serve", "configs/swe_demo.yaml", "--port", str(other),
                               "--address", ray_cluster.get_runtime_context().gcs_address, "serve.name=joined",
                               "serve.route_prefix=/joined", "serve.replicas=1"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == f"http://127.0.0.1:{running.port}/joined/v1"
        said = [line for line in done.stderr.splitlines() if "not applied" in line]
        assert said == [f"serve: Serve already runs on this cluster with its proxies on {running.host}:{running.port}; "
                        f"port {other} not applied (`serve shutdown` stops it, and its applications, so the next "
                        "start takes them)"], done.stderr[-3000:]
        assert "will not be applied" not in done.stderr  # Ray's line at every deploy, options given or not
    finally:
        if "joined" in serve.status().applications:
            serve.delete("joined")
