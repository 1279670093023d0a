"""The NeMo-Gym-compatible agent server over real HTTP: the calculator resources server, the scripted model on the
scripted server (OpenAI over 127.0.0.1, token ids and logprobs on), the farm behind ``/run``. One test per row of the
seed's termination and error tables, both contract generations, the limits."""

from __future__ import annotations

import json

import httpx

from agents.registry import AGENTS
from cluster.config.gym_section import give_cleanup_timeout
from cluster.farm.rollout_farm import RolloutFarm
from cluster.gym.rows import legacy_task
from envs.registry import ENVIRONMENTS
from envs.resources.calc_server import calc_rows
from envs.resources.serving import serve_in_thread
from rollout.protocols import AgentCapabilities, EnvironmentCapabilities, declared
from rollout.store.summary import summarize

from .gym_servers import SessionEnvironment, WholeEpisodeAgent, agent_server, episode, kinds, row, run_config


def test_run_seeds_calls_tools_verifies_and_returns_token_ids(calc):
    with agent_server(calc.url) as client:
        reply = client.post("/run", json=row()).json()
    assert reply["reward"] == 1.0
    assert kinds(reply) == ["function_call", "function_call_output", "message"]
    assert reply["expected_answer"] == row()["expected_answer"] and reply["responses_create_params"]
    assert reply["mask_sample"] is False and reply["failure_kind"] is None and reply["failure_reason"] is None
    call, _, answer = reply["response"]["output"]
    for item in (call, answer):
        assert item["prompt_token_ids"] and item["generation_token_ids"]
        assert len(item["generation_log_probs"]) == len(item["generation_token_ids"])
    # turn 2's prompt is turn 1's prompt + its generation + the tool output: one contiguous sequence
    assert answer["prompt_token_ids"][:len(call["prompt_token_ids"])] == call["prompt_token_ids"]
    assert reply["response"]["status"] == "completed"


def test_episode_contract_returns_a_result_or_a_typed_failure(calc):
    with agent_server(calc.url) as client:
        ok = client.post("/run", json=episode(row())).json()
        assert set(ok) == {"episode_id", "task_id", "result"}
        assert ok["episode_id"] == {"rollout_id": "ep-1", "attempt": 0} and ok["result"]["reward"] == 1.0
        assert ok["task_id"] == {"taskset": "calc", "task_id": row()["task_id"]}
    with agent_server("http://127.0.0.1:9") as client:  # nothing listens: the seed cannot happen
        failed = client.post("/run", json=episode(row(), "ep-2")).json()
        legacy = client.post("/run", json=row())
    assert legacy.status_code == 502 and legacy.json()["error"]["type"] == "environment_error"
    assert "unreachable" in legacy.json()["error"]["message"]
    assert set(failed) == {"episode_id", "task_id", "failure"}
    failure = failed["failure"]
    assert failure["stage"] == "seed" and failure["failure_kind"] == "session_lost"
    assert failure["terminal"] is False and "unreachable" in failure["failure_reason"]
    assert len(failure["failure_reason"]) <= 2000


def test_max_steps_ends_with_a_partial_rollout(calc):
    with agent_server(calc.url, max_steps=3) as client:
        reply = client.post("/run", json=row("[loop]")).json()
    assert kinds(reply).count("function_call") == 3 and kinds(reply).count("function_call_output") == 3
    assert reply["reward"] == 0.0 and reply["failure_reason"].startswith("step_limit")


def test_max_output_tokens_ends_early_as_incomplete(calc):
    with agent_server(calc.url) as client:
        params = row("[long]")
        params["responses_create_params"]["max_output_tokens"] = 16
        reply = client.post("/run", json=params).json()
    assert kinds(reply) == ["message"]
    assert reply["response"]["status"] == "incomplete"
    assert reply["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["failure_reason"].startswith("token_limit")


def test_a_model_server_500_fails_the_rollout_with_a_502_after_retries(calc):
    with agent_server(calc.url, faults={"fail_first_n": 1000, "status": 500}) as client:
        response = client.post("/run", json=row())
        failed = client.post("/run", json=episode(row(), "ep-3")).json()
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "model_error" and "500" in error["message"]
    assert failed["failure"]["stage"] == "agent", failed
    assert failed["failure"]["failure_kind"] == "agent_run_error"


def test_a_resources_server_500_on_a_tool_becomes_the_output_and_the_loop_goes_on(calc):
    with agent_server(calc.url) as client:
        reply = client.post("/run", json=row(fail_tool=True)).json()
    outputs = [i["output"] for i in reply["response"]["output"] if i["type"] == "function_call_output"]
    assert len(outputs) >= 2 and all("injected failure" in o for o in outputs)
    assert kinds(reply)[-1] == "message" and reply["reward"] == 0.0


def test_invalid_tool_arguments_are_fed_back_as_the_output(calc):
    with agent_server(calc.url) as client:
        reply = client.post("/run", json=row("[bad-args]")).json()
    first_output = next(i for i in reply["response"]["output"] if i["type"] == "function_call_output")
    assert "json" in first_output["output"].lower()
    assert reply["reward"] == 1.0, reply["response"]["output"]  # the model read the feedback and tried again


def test_a_tool_nobody_offered_is_an_observation_not_a_route(calc):
    with agent_server(calc.url) as client:
        reply = client.post("/run", json=row("[unknown-tool]")).json()
    first_output = next(i for i in reply["response"]["output"] if i["type"] == "function_call_output")
    assert "unknown tool 'abacus'" in first_output["output"] and reply["reward"] == 1.0


def test_v1_responses_runs_the_tool_loop_alone(calc):
    with agent_server(calc.url) as client:
        seeded = httpx.post(f"{calc.url}/seed_session", json=row())
        client.cookies.update(seeded.cookies)
        reply = client.post("/v1/responses", json=row()["responses_create_params"])
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "response" and [i["type"] for i in body["output"]] == [
        "function_call", "function_call_output", "message"]
    assert "reward" not in body
    assert reply.cookies.get("resources_session_id") == seeded.cookies["resources_session_id"]


def test_a_v1_responses_rollout_returns_its_response_and_cookies_beside_no_reward(calc):
    seeded = httpx.post(f"{calc.url}/seed_session", json=row())
    task = legacy_task({"responses_create_params": row()["responses_create_params"]}, "responses-1",
                       mode="responses", cookies=dict(seeded.cookies))
    with RolloutFarm.from_config(run_config(calc.url)) as farm:
        result = farm.generate([task]).results[0]
    assert result.status == "completed" and result.reward is None, result.error  # no verify: no verdict
    assert [i["type"] for i in result.outputs.response["output"]] == ["function_call", "function_call_output",
                                                                      "message"]
    assert result.outputs.cookies["resources_session_id"] == seeded.cookies["resources_session_id"]
    assert "response" not in result.reward_details and "cookies" not in result.reward_details
    summary = summarize([result])  # a rollout nothing scored counts in no reward number
    assert summary["rollouts"]["completed"] == 1 and summary["tasks"]["scored"] == 0
    assert summary["reward_mean"] is None and summary["success_rate"] is None and summary["pass_at_k"] == {"1": None}


def test_the_mini_swe_agent_answers_501_on_v1_responses(calc):
    with agent_server(calc.url, agent={"type": "mini_swe"}) as client:
        reply = client.post("/v1/responses", json=row()["responses_create_params"])
    assert reply.status_code == 501 and "POST /run" in reply.json()["error"]["message"]


def test_any_agent_class_that_owns_whole_episodes_answers_501_on_v1_responses_and_runs_run(calc):
    # the capability is the class's (``speaks_responses_api``), whatever name the config gives it
    agent = {"type": f"{WholeEpisodeAgent.__module__}:WholeEpisodeAgent", "max_steps": 6}
    with agent_server(calc.url, agent=agent) as client:
        refused = client.post("/v1/responses", json=row()["responses_create_params"])
        ran = client.post("/run", json=row())
    assert refused.status_code == 501 and ran.status_code == 200 and ran.json()["reward"] == 1.0


def test_the_registered_classes_declare_their_capabilities():
    whole_episodes = {name for name in AGENTS.names()
                      if not declared(AGENTS.load(name), AgentCapabilities).speaks_responses_api}
    closers = {name for name in ENVIRONMENTS.names()
               if declared(ENVIRONMENTS.load(name), EnvironmentCapabilities).closes_sessions}
    assert whole_episodes == {"mini_swe"} and closers == {"aviary", "resources"}


def test_the_cleanup_timeout_goes_to_every_environment_whose_class_closes_a_session():
    raw = {"environment": {"type": "resources", "url": "http://r"},
           "profiles": {"game": {"environment": {"type": "aviary", "url": "http://a", "cleanup_timeout": 5.0}},
                        "tools": {"environment": {"type": "tool"}}, "plain": {"agent": {"type": "tool_calling"}},
                        "own": {"environment": {"type": f"{SessionEnvironment.__module__}:SessionEnvironment"}}}}
    give_cleanup_timeout(raw, 12.0)
    profiles = raw["profiles"]
    assert raw["environment"]["cleanup_timeout"] == 12.0 and profiles["own"]["environment"]["cleanup_timeout"] == 12.0
    assert profiles["game"]["environment"]["cleanup_timeout"] == 5.0  # its own is kept
    assert "cleanup_timeout" not in profiles["tools"]["environment"] and "environment" not in profiles["plain"]


def test_bad_bodies_get_a_422_naming_the_field(calc):
    with agent_server(calc.url) as client:
        missing = client.post("/run", json={"task_id": "x"})
        wrong = client.post("/run", json={"responses_create_params": {"input": [{"type": "image"}]}})
        not_json = client.post("/run", content=b"{", headers={"content-type": "application/json"})
        bad_episode = client.post("/run", json={"episode_id": {"rollout_id": "r-a1", "attempt": 0},
                                                "task": {"task_id": {"taskset": "t", "task_id": "1"},
                                                         "task_input": row()}}).json()
    assert missing.status_code == 422 and "responses_create_params" in missing.json()["error"]["message"]
    assert wrong.status_code == 422 and "input[0]" in wrong.json()["error"]["message"]
    assert not_json.status_code == 422
    assert bad_episode["failure"]["terminal"] is True and bad_episode["failure"]["stage"] == "admission"
    assert "attempt suffix" in bad_episode["failure"]["failure_reason"]


def test_admission_and_episode_timeouts_are_non_terminal_failures(calc):
    limits = {"max_concurrent_episodes": 1, "queue_timeout": 0.5}
    with agent_server(calc.url, latency=1.0, gym=limits) as client:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.post, "/run", json=episode(row(), "slow-1"))
            second = pool.submit(client.post, "/run", json=episode(row(), "slow-2"))
            replies = [first.result().json(), second.result().json()]
        legacy = client.post("/run", json=row())  # (a place is free again: this one runs)
    admitted = [r for r in replies if "result" in r]
    refused = [r["failure"] for r in replies if "failure" in r]
    assert len(admitted) == 1 and len(refused) == 1
    assert refused[0]["stage"] == "admission" and refused[0]["terminal"] is False
    assert legacy.status_code == 200
    with agent_server(calc.url, latency=2.0, gym={"episode_timeout": 1.0}) as client:
        timed_out = client.post("/run", json=episode(row(), "slow-3")).json()["failure"]
    assert timed_out["failure_kind"] == "agent_timeout" and timed_out["terminal"] is False


def test_rollouts_run_on_the_farms_ray_workers(calc, ray_cluster):
    with agent_server(calc.url, backend="ray") as client:
        replies = [client.post("/run", json=r).json() for r in calc_rows(3, seed=5)]
    assert [r["reward"] for r in replies] == [1.0, 1.0, 1.0]
    assert json.dumps(replies)  # plain JSON all the way


def test_one_server_hosts_the_simple_and_the_aviary_agent_by_agent_ref(calc):
    from envs.resources.text_game import create_app as game_app

    with serve_in_thread(game_app()) as game:
        aviary = {"aviary": {"agent": {"type": "aviary", "max_steps": 12},
                             "environment": {"type": "aviary", "url": game.url}}}
        with agent_server(calc.url, profiles=aviary) as client:
            played = client.post("/run", json={"responses_create_params": {"input": []}, "task_idx": 7,
                                               "agent_ref": {"name": "aviary"}}).json()
            computed = client.post("/run", json=row()).json()
    assert played["reward"] == 1.0 and computed["reward"] == 1.0
    calls = [i for i in played["response"]["output"] if i["type"] == "function_call"]
    assert len(calls) > 1 and all(c["name"] == "guess" for c in calls)


def test_two_hundred_concurrent_runs_complete_without_error(calc):
    import asyncio

    rows = calc_rows(200, seed=9)
    with agent_server(calc.url, concurrency=200, gym={"max_concurrent_episodes": 200}) as client:
        async def post_all() -> list:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(base_url=str(client.base_url), timeout=300, limits=limits) as aclient:
                return await asyncio.gather(*(aclient.post("/run", json=r) for r in rows))

        replies = asyncio.run(post_all())
    assert [r.status_code for r in replies] == [200] * 200
    assert [r.json()["task_id"] for r in replies] == [r["task_id"] for r in rows]
    assert all(r.json()["reward"] == 1.0 for r in replies)
