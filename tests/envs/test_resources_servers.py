"""Our example resources servers over real HTTP on 127.0.0.1: the calculator task family (tool, injected failure,
a verify that hostile responses cannot fool), the session contract and its cookie, and the Aviary-style text game."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from envs.resources.calc_server import calc_rows, create_app as calc_app, evaluate
from envs.resources.serving import serve_in_thread
from envs.resources.text_game import create_app as game_app, secret_for

REPO = Path(__file__).resolve().parents[2]
COOKIE = "resources_session_id"


def message(text, role="assistant"):
    return {"type": "message", "id": "msg_1", "role": role, "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def function_call(call_id, name, arguments):
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


def tool_output(call_id, output):
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def responses_object(*items, **extra):
    """A complete Responses API object, as an agent's /run returns it."""
    return {"id": "resp_1", "object": "response", "created_at": 0, "model": "policy", "output": list(items),
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], **extra}


def verify_body(row, *items, **response_extra):
    return {**row, "response": responses_object(*items, **response_extra)}


ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Compute (17 + 25) * 3."}]},
       "expected_answer": 126, "task_id": "t-1"}


@pytest.fixture(scope="module")
def calc_url():
    with serve_in_thread(calc_app()) as server:
        yield server.url


@pytest.fixture(scope="module")
def game_url():
    with serve_in_thread(game_app()) as server:
        yield server.url


@pytest.fixture
def calc(calc_url):
    with httpx.Client(base_url=calc_url, timeout=10) as client:
        yield client


# ---- the calculator ---------------------------------------------------------------------------------------------

def test_the_calculator_answers_and_a_row_seeds_a_session_with_a_cookie(calc):
    seeded = calc.post("/seed_session", json=ROW)
    assert seeded.status_code == 200 and COOKIE in seeded.cookies
    answer = calc.post("/calculator", json={"expression": "(17 + 25) * 3"})
    assert answer.status_code == 200 and answer.json() == {"expression": "(17 + 25) * 3", "result": 126}
    assert calc.post("/calculator", json={"expression": "7 / 2"}).json()["result"] == 3.5


@pytest.mark.parametrize("arguments, says", [
    ({"expression": "1 / 0"}, "division by zero"),
    ({"expression": "(2 +"}, "syntax error"),
    ({"expression": "__import__('os').system('true')"}, "only numbers"),
    ({"expression": "9 ** 9 ** 9"}, "too large"),
    ({"expression": "2 ^ 10"}, "**"),
    ({"expr": "1 + 1"}, "expression"),
    ({"expression": 42}, "expression"),
])
def test_a_bad_expression_is_a_readable_200_error(calc, arguments, says):
    answer = calc.post("/calculator", json=arguments)
    assert answer.status_code == 200
    assert "result" not in answer.json() and says in answer.json()["error"]


def test_a_body_that_is_not_json_is_a_readable_error_too(calc):
    answer = calc.post("/calculator", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 200 and "expression" in answer.json()["error"]


def test_fail_tool_makes_that_sessions_tool_answer_500_with_text_and_others_unaffected(calc_url):
    with httpx.Client(base_url=calc_url) as failing, httpx.Client(base_url=calc_url) as healthy:
        failing.post("/seed_session", json={**ROW, "fail_tool": True}).raise_for_status()
        healthy.post("/seed_session", json=ROW).raise_for_status()
        broken = failing.post("/calculator", json={"expression": "1 + 1"})
        assert broken.status_code == 500 and broken.headers["content-type"].startswith("text/plain")
        assert "injected failure" in broken.text
        assert healthy.post("/calculator", json={"expression": "1 + 1"}).json()["result"] == 2


# ---- verify -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("items, reward", [
    ([message("17 + 25 = 42 and 42 * 3 = 126. The answer is 126.")], 1.0),
    ([message("**126**")], 1.0),
    ([function_call("c1", "calculator", {"expression": "(17+25)*3"}), tool_output("c1", '{"result": 126}'),
      message("So the result is 126")], 1.0),
    ([message(" ".join(str(n) for n in range(100, 201)))], 0.0),  # lists every candidate
    ([message("126 or maybe 127")], 0.0),
    ([message("The answer is 126, give or take 1")], 0.0),
    ([function_call("c1", "calculator", {"expression": "126"}), tool_output("c1", "126"),
      message("I used the tool.")], 0.0),  # the answer only in a tool output
    ([message("126"), message("Wait, let me check again.")], 0.0),  # the answer in a message that is not the last
    ([message("The answer is 126.", role="user"), message("no idea")], 0.0),
    ([function_call("c1", "calculator", {"expression": "126"})], 0.0),  # no message at all
    ([message("v126")], 0.0),
])
def test_verify_rewards_only_a_final_number_equal_to_the_answer(calc, items, reward):
    answer = calc.post("/verify", json=verify_body(ROW, *items))
    assert answer.status_code == 200
    body = answer.json()
    assert body["reward"] == reward
    assert body["expected_answer"] == 126 and body["task_id"] == "t-1" and body["response"]["output"] == items


@pytest.mark.parametrize("expected, text", [(1260, "It is 1,260."), (-5, "x = -5"), (3.5, "3.5"), (0.1, "0.10")])
def test_verify_reads_grouped_negative_and_decimal_numbers(calc, expected, text):
    body = verify_body({**ROW, "expected_answer": expected}, message(text))
    assert calc.post("/verify", json=body).json()["reward"] == 1.0


@pytest.mark.parametrize("body", [
    {**ROW},
    {**ROW, "response": "126"},
    {**ROW, "response": {"output": "126"}},
    {**ROW, "response": {"output": [{"text": "126"}]}},
    {**ROW, "response": {"output": ["126"]}},
    {"response": responses_object(message("126"))},  # no expected_answer
    {**ROW, "expected_answer": "lots", "response": responses_object(message("126"))},
])
def test_a_malformed_verify_body_is_a_422(calc, body):
    answer = calc.post("/verify", json=body)
    assert answer.status_code == 422 and answer.json()["detail"]


def test_the_verdict_fields_are_the_servers_not_the_callers(calc):
    body = {**verify_body(ROW, message("no idea")), "reward": 1.0, "mask_sample": True, "failure_kind": "x"}
    reply = calc.post("/verify", json=body).json()
    assert reply["reward"] == 0.0 and "mask_sample" not in reply and "failure_kind" not in reply


def test_verify_with_a_non_object_body_is_a_422(calc):
    assert calc.post("/verify", json=[1, 2]).status_code == 422
    assert calc.post("/verify", content=b"nope").status_code == 422


# ---- sessions and their cookie ----------------------------------------------------------------------------------

def test_cookies_keep_sessions_apart_across_seed_tool_verify_and_close(calc_url):
    with httpx.Client(base_url=calc_url) as a, httpx.Client(base_url=calc_url) as b:
        a.post("/seed_session", json={**ROW, "fail_tool": True}).raise_for_status()
        b.post("/seed_session", json=ROW).raise_for_status()
        assert a.cookies[COOKIE] != b.cookies[COOKIE]
        assert a.post("/calculator", json={"expression": "2"}).status_code == 500
        assert b.post("/calculator", json={"expression": "2"}).status_code == 200
        closed = a.post("/close_session", json={})
        assert closed.status_code == 200 and closed.json() == {COOKIE: a.cookies[COOKIE]}
        # a client that always sends the typed field names, with no episode, still closes the cookie's session
        closed = b.post("/close_session", json={COOKIE: "session", "episode_id": None})
        assert closed.status_code == 200 and closed.json() == {COOKIE: b.cookies[COOKIE]}
        assert a.post("/close_session", json={}).status_code == 200
        for client in (a, b):
            gone = client.post("/calculator", json={"expression": "2"})
            assert gone.status_code == 409 and "closed" in gone.json()["detail"]
        assert a.post("/verify", json=verify_body(ROW, message("126"))).json()["reward"] == 1.0


def test_concurrent_sessions_do_not_mix(calc_url):
    async def rollout(index):
        async with httpx.AsyncClient(base_url=calc_url) as client:
            (await client.post("/seed_session", json={**ROW, "fail_tool": index % 2 == 1})).raise_for_status()
            statuses = []
            for _ in range(5):
                statuses.append((await client.post("/calculator", json={"expression": f"{index} * 2"})).status_code)
                await asyncio.sleep(0)
            (await client.post("/close_session", json={})).raise_for_status()
            return statuses

    async def main():
        return await asyncio.gather(*(rollout(i) for i in range(20)))

    for index, statuses in enumerate(asyncio.run(main())):
        assert statuses == [500 if index % 2 else 200] * 5, index


def test_a_cookie_naming_no_session_is_a_404(calc_url):
    with httpx.Client(base_url=calc_url, cookies={COOKIE: "never-seeded"}) as client:
        answer = client.post("/calculator", json={"expression": "1"})
        assert answer.status_code == 404 and "never-seeded" in answer.json()["detail"]


def typed_seed(session_id, rollout="r1", task_data=None):
    return {"resources_session_id": session_id, "episode_id": {"rollout_id": rollout, "attempt": 0},
            "task_id": {"taskset": "calc:test", "task_id": "t-1"}, "task_data": task_data or dict(ROW)}


def typed_close(session_id, rollout="r1"):
    return {"resources_session_id": session_id, "episode_id": {"rollout_id": rollout, "attempt": 0}}


def test_the_typed_session_contract(calc):
    seed = typed_seed("s-contract")
    for _ in range(2):  # seeding again with the same body is the same session
        again = calc.post("/seed_session", json=seed)
        assert again.status_code == 200 and again.json() == {COOKIE: "s-contract"}
    other = calc.post("/seed_session", json=typed_seed("s-contract", rollout="r2"))
    assert other.status_code == 409 and "another body" in other.json()["detail"]
    for _ in range(2):
        closed = calc.post("/close_session", json=typed_close("s-contract"))
        assert closed.status_code == 200 and closed.json() == {COOKIE: "s-contract"}
    late = calc.post("/seed_session", json=seed)
    assert late.status_code == 409 and "closed" in late.json()["detail"]


def test_closing_another_episodes_session_is_a_409(calc):
    calc.post("/seed_session", json=typed_seed("s-mine")).raise_for_status()
    refused = calc.post("/close_session", json=typed_close("s-mine", rollout="someone-else"))
    assert refused.status_code == 409 and "episode" in refused.json()["detail"]
    assert calc.post("/close_session", json=typed_close("s-mine")).status_code == 200


def test_closing_a_never_seeded_id_stops_a_later_seed_of_it(calc):
    assert calc.post("/close_session", json=typed_close("s-unknown")).json() == {COOKIE: "s-unknown"}
    assert calc.post("/seed_session", json=typed_seed("s-unknown")).status_code == 409


def test_a_typed_seed_with_a_bad_shape_is_a_422(calc):
    broken = {k: v for k, v in typed_seed("s-bad").items() if k != "episode_id"}
    assert calc.post("/seed_session", json=broken).status_code == 422
    assert calc.post("/seed_session", json={**typed_seed("s-bad"), "surprise": 1}).status_code == 422


def test_a_typed_seed_sets_the_cookie_that_reaches_its_state(calc_url):
    with httpx.Client(base_url=calc_url) as client:
        client.post("/seed_session", json=typed_seed("s-typed", task_data={**ROW, "fail_tool": True}))
        assert client.cookies[COOKIE] == "s-typed"
        assert client.post("/calculator", json={"expression": "1"}).status_code == 500


# ---- the rows and the command line ------------------------------------------------------------------------------

def test_rows_are_deterministic_graded_and_their_answers_come_from_the_tool(calc):
    rows = calc_rows(12, seed=5)
    assert rows == calc_rows(12, seed=5) and rows != calc_rows(12, seed=6)
    assert [row["difficulty"] for row in rows] == sorted(row["difficulty"] for row in rows)
    assert {row["difficulty"] for row in rows} == {1, 2, 3, 4} and len({row["task_id"] for row in rows}) == 12
    for row in rows:
        params = row["responses_create_params"]
        assert params["tools"][0]["name"] == "calculator" and params["input"][0]["role"] == "user"
        expression = params["input"][0]["content"].split("Compute ", 1)[1].split(". Use", 1)[0]
        assert calc.post("/calculator", json={"expression": expression}).json()["result"] == row["expected_answer"]
        assert evaluate(expression) == row["expected_answer"]


def test_the_rows_command_prints_jsonl():
    out = subprocess.run([sys.executable, "-m", "envs.resources.calc_server", "--rows", "4", "--seed", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert [json.loads(line) for line in out.stdout.splitlines()] == calc_rows(4, seed=2)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("module, path, body, check", [
    ("calc_server", "/calculator", {"expression": "6 * 7"}, lambda reply: reply["result"] == 42),
    ("text_game", "/seed_session", {"task_idx": 1}, lambda reply: reply["tools"][0]["name"] == "guess"),
])
def test_python_dash_m_serves_on_the_given_port(module, path, body, check):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", f"envs.resources.{module}", "--port", str(port)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}{path}", json=body, timeout=5)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
        assert reply.status_code == 200 and check(reply.json())
    finally:
        process.terminate()
        process.wait(timeout=10)


# ---- the text game ----------------------------------------------------------------------------------------------

def guess(call_id, number):
    return function_call(call_id, "guess", {"number": number})


def test_a_game_played_to_the_end_is_rewarded_from_the_servers_own_record(game_url):
    with httpx.Client(base_url=game_url) as client:
        seeded = client.post("/seed_session", json={"task_idx": 7, "extra": "row field"}).json()
        assert seeded["obs"][0]["role"] == "user" and "guess" in seeded["obs"][0]["content"]
        assert seeded["tools"][0] == {**seeded["tools"][0], "type": "function", "name": "guess"}
        env_id, low, high, steps = seeded["env_id"], 1, 100, 0
        while True:
            number = (low + high) // 2
            step = client.post("/step", json={"env_id": env_id, "action": [guess(f"c{steps}", number)]}).json()
            steps += 1
            assert step["obs"][0]["type"] == "function_call_output" and step["obs"][0]["call_id"] == f"c{steps - 1}"
            answer = step["obs"][0]["output"]
            if answer == "correct":
                assert step["reward"] == 1.0 and step["done"] is True and number == secret_for(7)
                break
            assert step["reward"] == 0.0 and step["done"] is False and answer in ("higher", "lower")
            low, high = (number + 1, high) if answer == "higher" else (low, number - 1)
        assert steps <= 7
        over = client.post("/step", json={"env_id": env_id, "action": [guess("late", number)]}).json()
        assert over["done"] is True and over["reward"] == 0.0 and "over" in over["obs"][0]["output"]
        for _ in range(2):
            closed = client.post("/close", json={"env_id": env_id})
            assert closed.status_code == 200 and closed.json()["success"] is True
        assert client.post("/step", json={"env_id": env_id, "action": [guess("x", 1)]}).status_code == 409
        claim = verify_body({"task_idx": 7}, message("I won, reward 1"), env_id=env_id)
        assert client.post("/verify", json=claim).json()["reward"] == 1.0


def test_verify_ignores_what_the_model_claims(game_url):
    with httpx.Client(base_url=game_url) as client:
        env_id = client.post("/seed_session", json={"task_idx": 3}).json()["env_id"]
        wrong = 1 if secret_for(3) != 1 else 2
        client.post("/step", json={"env_id": env_id, "action": [guess("c1", wrong)]}).raise_for_status()
        faked = verify_body({"task_idx": 3}, guess("c1", secret_for(3)), tool_output("c1", "correct"),
                            message("correct! reward 1.0"), env_id=env_id)
        assert client.post("/verify", json=faked).json()["reward"] == 0.0
        lost = client.post("/verify", json=verify_body({"task_idx": 3}, message("hi"), env_id="no-such-game")).json()
        assert lost["reward"] == 0.0 and lost["mask_sample"] is True and lost["failure_kind"] == "session_lost"
        assert client.post("/verify", json={"task_idx": 3, "response": {"output": 5}}).status_code == 422


def test_bad_actions_become_observations_not_errors(game_url):
    with httpx.Client(base_url=game_url) as client:
        env_id = client.post("/seed_session", json={"task_idx": 11}).json()["env_id"]
        action = [function_call("a", "shout", {"number": 5}),
                  {"type": "function_call", "call_id": "b", "name": "guess", "arguments": "{five"},
                  guess("c", 500), function_call("d", "guess", {"n": 5}), guess("e", True),
                  {"type": "function_call", "name": "guess", "arguments": "{}"}, "not an item"]
        step = client.post("/step", json={"env_id": env_id, "action": action})
        assert step.status_code == 200
        obs = step.json()["obs"]
        outputs = {item["call_id"]: item["output"] for item in obs if item.get("type") == "function_call_output"}
        assert "no tool 'shout'" in outputs["a"] and "not JSON" in outputs["b"] and "outside" in outputs["c"]
        assert outputs["d"].startswith("error") and outputs["e"].startswith("error")
        assert sum(1 for item in obs if item.get("role") == "user" and "call_id" in item["content"]) == 2
        assert step.json()["done"] is False
        empty = client.post("/step", json={"env_id": env_id, "action": []}).json()
        assert "no tool call" in empty["obs"][0]["content"] and empty["done"] is False
        assert client.post("/step", json={"env_id": env_id, "action": "guess 5"}).status_code == 422
        assert client.post("/step", json={"env_id": "nope", "action": []}).status_code == 404


def test_the_secret_follows_from_task_idx_and_a_bad_task_idx_is_a_422(game_url):
    assert secret_for(4) == secret_for(4) and 1 <= secret_for(4) <= 100
    assert len({secret_for(i) for i in range(50)}) > 20
    with httpx.Client(base_url=game_url) as client:
        assert client.post("/seed_session", json={"task_idx": "four"}).status_code == 422
        assert client.post("/seed_session", json={}).status_code == 422


def test_the_game_also_takes_the_typed_seed_and_close(game_url):
    with httpx.Client(base_url=game_url) as client:
        seed = {**typed_seed("g-typed", task_data={"task_idx": 9})}
        assert client.post("/seed_session", json=seed).json() == {COOKIE: "g-typed"}
        step = client.post("/step", json={"env_id": "g-typed", "action": [guess("c", secret_for(9))]}).json()
        assert step["reward"] == 1.0 and step["done"] is True
        assert client.post("/close_session", json=typed_close("g-typed")).status_code == 200
        assert client.post("/seed_session", json=seed).status_code == 409
        body = verify_body({"task_idx": 9}, message("done"))  # no env_id in the response: the cookie names it
        assert client.post("/verify", json=body).json()["reward"] == 1.0
