"""Our resources servers judged by NeMo Gym 0.7.0 itself (its pydantic models and its session conformance check,
run in a venv of its own): what they send and answer is what NeMo Gym's agents and collectors accept."""

from __future__ import annotations

import json

import httpx
import pytest

from envs.resources.calc_server import calc_rows, create_app as calc_app
from envs.resources.serving import serve_in_thread
from envs.resources.text_game import create_app as game_app, secret_for

BASE = "nemo_gym.base_resources_server"
AVIARY = "resources_servers.aviary.schemas"


def responses_object(*items, **extra):
    return {"id": "resp_1", "object": "response", "created_at": 0, "model": "policy", "output": list(items),
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], **extra}


def message(text):
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def guess(call_id, number):
    return {"type": "function_call", "call_id": call_id, "name": "guess", "arguments": json.dumps({"number": number})}


@pytest.mark.parametrize("factory, task_data", [
    ("envs.resources.calc_server:create_app", calc_rows(1, seed=0)[0]),
    ("envs.resources.text_game:create_app", {"task_idx": 3}),
])
def test_our_servers_pass_nemo_gyms_session_conformance_check(nemo_gym, factory, task_data):
    nemo_gym.check_session_contract(factory, keeps_state=True, task_data=task_data)


def test_a_server_that_revives_closed_sessions_fails_the_check(nemo_gym):
    """The check is real: a server that forgets closed sessions is caught."""
    with pytest.raises(AssertionError, match="seed after close recreated"):
        nemo_gym.check_session_contract("tests.gym.nemo_gym_venv:forgetful_app", keeps_state=True)


def test_calc_rows_are_nemo_gym_run_requests(nemo_gym):
    rows = calc_rows(16, seed=1)
    validated = nemo_gym.validate_many([(f"{BASE}:BaseRunRequest", row) for row in rows])
    for row, value in zip(rows, validated):
        assert value["responses_create_params"]["tools"][0]["name"] == "calculator"
        assert value["responses_create_params"]["input"][0]["content"] == row["responses_create_params"]["input"][0][
            "content"]


def test_calc_verify_requests_and_replies_are_nemo_gym_verify_models(nemo_gym):
    row = calc_rows(3, seed=2)[2]
    call = {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": '{"expression": "1+1"}'}
    output = {"type": "function_call_output", "call_id": "c1", "output": '{"result": 2}'}
    bodies = [{**row, "response": responses_object(call, output, message(f"It is {row['expected_answer']}."))},
              {**row, "response": responses_object(message("1 2 3"))}]
    with serve_in_thread(calc_app()) as server:
        replies = [httpx.post(f"{server.url}/verify", json=body).json() for body in bodies]
    assert [reply["reward"] for reply in replies] == [1.0, 0.0]
    checked = nemo_gym.validate_many([(f"{BASE}:BaseVerifyRequest", body) for body in bodies]
                                     + [(f"{BASE}:BaseVerifyResponse", reply) for reply in replies])
    assert [value["reward"] for value in checked[2:]] == [1.0, 0.0]


def test_the_text_game_speaks_nemo_gyms_aviary_wire(nemo_gym):
    with serve_in_thread(game_app()) as server, httpx.Client(base_url=server.url) as client:
        seeded = client.post("/seed_session", json={"task_idx": 5}).json()
        step_request = {"env_id": seeded["env_id"], "action": [guess("c1", secret_for(5)), guess("c2", 0)]}
        step = client.post("/step", json=step_request).json()
        body = {"responses_create_params": {"input": seeded["obs"], "tools": seeded["tools"]},
                "response": responses_object(message("done"), env_id=seeded["env_id"])}
        verified = client.post("/verify", json=body).json()
        lost = client.post("/verify", json={**body, "response": responses_object(env_id="gone")}).json()
        closed = client.post("/close", json={"env_id": seeded["env_id"]}).json()
    assert step["reward"] == 1.0 and verified["reward"] == 1.0 and lost["failure_kind"] == "session_lost"
    nemo_gym.validate_many([
        (f"{AVIARY}:AviarySeedSessionRequest", {"task_idx": 5}),
        (f"{AVIARY}:AviarySeedSessionResponse", seeded),
        (f"{AVIARY}:AviaryStepRequest", step_request),
        (f"{AVIARY}:AviaryStepResponse", step),
        (f"{AVIARY}:AviaryCloseResponse", closed),
        (f"{BASE}:BaseVerifyResponse", verified),
        (f"{BASE}:BaseVerifyResponse", lost),
    ])


def test_validate_reports_nemo_gyms_own_error(nemo_gym):
    with pytest.raises(AssertionError, match="responses_create_params"):
        nemo_gym.validate(f"{BASE}:BaseRunRequest", {"expected_answer": 1})
