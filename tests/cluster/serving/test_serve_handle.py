"""The run's workers call its scripted Serve app through a ``DeploymentHandle`` (no HTTP proxy): the same replies,
token data and usage as the HTTP client's, each rollout's turns on one replica, errors retried and reported like
a broken connection, and the composer picking the handle only for the run's own application."""

from __future__ import annotations

import asyncio
import json

import pytest

CALC_TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "evaluate arithmetic",
               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


def _config(base_url: str, **fields):
    from rollout.models.client.config import OpenAIModelConfig

    return OpenAIModelConfig(base_url=base_url, model="scripted-demo", logprobs=True, return_token_ids=True,
                             release_sessions=True, **fields)


def test_the_handle_path_answers_as_the_proxy_does_with_token_data_and_usage(scripted):
    from cluster.serving.handle_model import HandleModel
    from cluster.serving.kinds.scripted import DEPLOYMENT
    from rollout.models.client.model import OpenAIModel
    from rollout.records import RequestMeta

    messages = [{"role": "user", "content": "What is (17 * 23) + 4?"}]

    async def both():
        replies = []
        for model in (OpenAIModel(_config(scripted.base_url)),
                      HandleModel(_config(scripted.base_url), scripted.section.name, DEPLOYMENT)):
            meta = RequestMeta(rollout_id="tools-arithmetic#0", task_id="tools-arithmetic", policy_version="3")
            replies.append(await model.complete(messages, CALC_TOOLS, meta=meta))
            await model.end_session(meta)
            await model.aclose()
        return replies

    def without_call_ids(reply):  # each replica numbers its tool calls; the two calls may meet different ones
        data = reply.model_dump()
        for call in data["message"]["tool_calls"]:
            call.pop("id")
        return data

    over_http, over_handle = asyncio.run(both())
    assert over_handle.message["tool_calls"][0]["function"]["name"] == "calculate"
    assert without_call_ids(over_handle) == without_call_ids(over_http)
    assert over_handle.completion_token_ids and over_handle.logprobs and over_handle.usage.completion_tokens > 0


def test_each_rollouts_turns_stay_on_one_replica_and_rollouts_share_the_replicas(scripted):
    from cluster.serving.handle_model import HandleModel, HandleTransport
    from cluster.serving.kinds.scripted import DEPLOYMENT
    from rollout.records import RequestMeta

    model = HandleModel(_config(scripted.base_url), scripted.section.name, DEPLOYMENT)
    transport = HandleTransport(model)
    body = json.dumps({"model": "scripted-demo", "messages": [{"role": "user", "content": "hi"}]}).encode()

    async def one(sid):
        seen = []
        for _ in range(4):
            status, headers, raw = await transport.post(body, {"X-Rollout-Id": sid}, 30)
            assert status == 200 and json.loads(raw)["choices"], raw
            seen.append(headers["x-serve-replica"])
        await model.end_session(RequestMeta(rollout_id=sid))
        return seen

    async def main():
        return await asyncio.gather(*(one(f"h{i}") for i in range(12)))

    placed = asyncio.run(main())
    assert all(len(set(replicas)) == 1 for replicas in placed), placed
    assert len({replicas[0] for replicas in placed}) == 2


def test_a_missing_application_is_a_model_error_after_the_clients_retries(ray_cluster):
    from cluster.serving.handle_model import HandleModel
    from rollout.errors import ModelError
    from rollout.records import RequestMeta

    model = HandleModel(_config("http://127.0.0.1:9/v1", max_retries=0), "no-such-app", "ScriptedPolicyServer")
    with pytest.raises(ModelError, match="failed after 1 attempt.*HTTP 500: .*the Serve call failed"):
        asyncio.run(model.complete([{"role": "user", "content": "hi"}], meta=RequestMeta(rollout_id="r")))


def test_the_composer_gives_the_handle_model_for_the_runs_own_scripted_app_only(scripted, ray_cluster):
    from cluster.compose import Composer
    from cluster.config.run_config import RunConfig
    from cluster.serving.handle_model import HandleModel
    from rollout.models.client.model import OpenAIModel

    def composer(**serve):
        return Composer(RunConfig.model_validate({
            "dataset": {"path": "-"}, "agent": {"type": "mini_swe"}, "environment": {"type": "shell"},
            "runtime": {"type": "local"},
            "model": {"type": "openai", "model": "scripted-demo"},
            "serve": {"app": "scripted", "name": scripted.section.name, "policy": "demo", **serve}}))

    built = composer().build_model(scripted.base_url)
    assert isinstance(built, HandleModel) and built.app == scripted.section.name and built.config.release_sessions
    assert type(composer(handle_calls=False).build_model(scripted.base_url)) is OpenAIModel
    assert type(composer().build_model(None)) is OpenAIModel  # no URL yet: not the deployed app

    def in_a_worker(composer, url):  # as a farm worker builds it, from the composer it is shipped
        from cluster.backends.sources import ConfigSource

        return type(ConfigSource(composer, url).build_model()).__name__

    remote = ray_cluster.remote(in_a_worker)
    assert ray_cluster.get(remote.remote(composer(), scripted.base_url)) == "HandleModel"
