"""Our bodies, validated by NeMo Gym 0.7.0's own models (in its own venv): what ``/run`` takes and answers in
both contract generations, ``/v1/responses``, and what our resources environment sends a resources server."""

from __future__ import annotations

import json

from envs.resources.calc_server import create_app
from envs.resources.serving import serve_in_thread

from .gym_servers import agent_server, episode, row

RESOURCES = "nemo_gym.base_resources_server"
TURN = "nemo_gym.single_agent_turn_types"


def recording_calc_app(seen: list) -> object:
    """The calculator server, recording what arrives at its session routes."""
    app = create_app()

    @app.middleware("http")
    async def record(request, call_next):
        if request.url.path in ("/seed_session", "/close_session", "/verify"):
            seen.append((request.url.path, json.loads(await request.body() or b"{}")))
        return await call_next(request)

    return app


def test_run_bodies_and_replies_validate_against_nemo_gym(nemo_gym, calc):
    with agent_server(calc.url) as client:
        legacy = client.post("/run", json=row()).json()
        partial = client.post("/run", json=row("[loop]")).json()
        cut = client.post("/run", json={**row("[long]")}).json()
        responses = client.post("/v1/responses", json=row()["responses_create_params"]).json()
        ok = client.post("/run", json=episode(row(), "ok-1")).json()
    with agent_server("http://127.0.0.1:9") as client:
        failed = client.post("/run", json=episode(row(), "down-1")).json()
    assert "result" in ok and "failure" in failed
    items = [i for i in legacy["response"]["output"] if "generation_token_ids" in i]
    assert items, "the model's items carry token data"
    results = nemo_gym.validate_many([
        (f"{RESOURCES}:BaseRunRequest", row()),
        (f"{RESOURCES}:BaseVerifyResponse", legacy),
        (f"{RESOURCES}:BaseVerifyResponse", partial),
        (f"{RESOURCES}:BaseVerifyResponse", cut),
        ("nemo_gym.openai_utils:NeMoGymResponse", responses),
        (f"{TURN}:SingleAgentTurnRequest", episode(row(), "ok-1")),
        (f"{TURN}:SingleAgentTurnResponse", ok),
        (f"{TURN}:SingleAgentTurnResponse", failed),
        ("nemo_gym.episode_types:EpisodeFailure", failed["failure"]),
    ])
    assert len(results) == 9
    assert results[1]["reward"] == 1.0 and results[6]["result"]["reward"] == 1.0
    assert results[8]["failure_kind"] == "session_lost" and results[8]["stage"] == "seed"


def test_what_the_resources_environment_sends_validates_against_nemo_gym(nemo_gym):
    seen: list = []
    with serve_in_thread(recording_calc_app(seen)) as server:
        with agent_server(server.url) as client:
            assert client.post("/run", json=episode(row(), "typed-1")).json()["result"]["reward"] == 1.0
            assert client.post("/run", json=row()).json()["reward"] == 1.0
    by_route = {}
    for path, body in seen:
        by_route.setdefault(path, []).append(body)
    typed_seed, legacy_seed = by_route["/seed_session"]
    typed_close = by_route["/close_session"][0]
    assert typed_seed["episode_id"] == {"rollout_id": "typed-1", "attempt": 0}
    assert typed_seed["resources_session_id"] == typed_close["resources_session_id"]
    assert legacy_seed == row()
    nemo_gym.validate_many([
        (f"{RESOURCES}:ResourcesSeedSessionRequest", typed_seed),
        (f"{RESOURCES}:ResourcesCloseSessionRequest", typed_close),
        (f"{RESOURCES}:BaseRunRequest", legacy_seed),
        *((f"{RESOURCES}:BaseVerifyRequest", body) for body in by_route["/verify"]),
    ])
