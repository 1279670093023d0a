"""The Aviary step agent playing the guess-the-number text game over real HTTP on 127.0.0.1: every way an episode
ends, the corrective message, collapsed environment states, the length budget (run by the loop, and stepped by a
caller that owns generation), and the resources server's failures."""

import asyncio
import json
import re

import pytest
from fastapi.responses import JSONResponse, PlainTextResponse

from agents.registry import AGENTS
from agents.step_agent import AviaryStepAgent, AviaryStepAgentConfig
from envs.registry import ENVIRONMENTS
from envs.resources.aviary_env import AviaryEnvironment, AviaryEnvironmentConfig
from envs.resources.serving import serve_in_thread
from envs.resources.text_game import create_app, secret_for
from rollout.errors import ExitReason
from rollout.models.scripted import ScriptedModel
from rollout.records import GymContext, RequestMeta, Task
from rollout.runner import run_rollout

COOKIE = "resources_session_id"


class Game:
    """The text game server, with a log of the requests it got, faults to inject (``fail[path]``: the statuses of
    the next requests to that path) and, with ``states``, an environment-state message after each seed and step."""

    def __init__(self, states: bool = False):
        self.app = create_app()
        self.requests: list[tuple[str, dict, str | None]] = []
        self.fail: dict[str, list[int]] = {}
        self.states = states
        self.url = ""
        self.app.middleware("http")(self._around)

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.requests]

    async def _around(self, request, call_next):
        path = request.url.path
        body = json.loads(await request.body() or b"{}")
        self.requests.append((path, body, request.cookies.get(COOKIE)))
        if self.fail.get(path):
            return PlainTextResponse(f"{path} crashed: the game engine is down", status_code=self.fail[path].pop(0))
        response = await call_next(request)
        if not self.states or path not in ("/seed_session", "/step") or response.status_code != 200:
            return response
        data = json.loads(b"".join([chunk async for chunk in response.body_iterator]))
        env_id = data.get("env_id") or body.get("env_id")
        made = sum(1 for p, b, _ in self.requests if p == "/step" and b.get("env_id") == env_id)
        data["obs"].append({"role": "user", "content": f"State: {made} guesses made", "is_env_state": True})
        reply = JSONResponse(data)
        reply.raw_headers.extend(h for h in response.raw_headers if h[0] == b"set-cookie")
        return reply


@pytest.fixture
def game():
    server_game = Game()
    with serve_in_thread(server_game.app) as server:
        server_game.url = server.url
        yield server_game


@pytest.fixture
def stateful_game():
    server_game = Game(states=True)
    with serve_in_thread(server_game.app) as server:
        server_game.url = server.url
        yield server_game


def guess(number):
    return {"tool_calls": [{"name": "guess", "arguments": {"number": number}}]}


def binary_search(messages, ctx):
    """Plays the game from the conversation it is shown: each higher/lower answer halves the range."""
    low, high, last = 1, 100, None
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            last = json.loads(message["tool_calls"][0]["function"]["arguments"])["number"]
        elif message["role"] == "tool" and message["content"] == "higher":
            low = last + 1
        elif message["role"] == "tool" and message["content"] == "lower":
            high = last - 1
    return guess((low + high) // 2)


class Recording(ScriptedModel):
    """The scripted model, keeping every prompt and tool list it was sent."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.prompts, self.tools = [], []

    async def complete(self, messages, tools=None, **kw):
        self.prompts.append([dict(m) for m in messages])
        self.tools.append(tools)
        return await super().complete(messages, tools, **kw)


def run(game, outputs=None, policy=binary_search, task_idx=7, url=None, model=None, **config):
    agent = AviaryStepAgent(AviaryStepAgentConfig(**config))
    env = AviaryEnvironment(AviaryEnvironmentConfig(url=url or game.url, timeout=10, cleanup_timeout=5))
    task = Task(task_id=f"game-{task_idx}",
                data={"row": {"task_idx": task_idx, "responses_create_params": {"input": []}}})
    if model is None:
        model = Recording(outputs) if outputs is not None else Recording(policy=policy)
    result = asyncio.run(run_rollout(task, agent, model, env, verifier=env, limits=agent.limits(),
                                     meta=RequestMeta(rollout_id=f"r-{task_idx}", task_id=task.task_id)))
    return result, model


def test_plays_the_game_to_done_and_is_rewarded_by_verify(game):
    result, model = run(game)
    assert result.status == "completed" and result.exit_reason == ExitReason.ENVIRONMENT_DONE
    assert result.reward == 1.0 and result.reward_details["verify_response"]["reward"] == 1.0
    assert len(result.trajectory.steps) == 7  # binary search finds 30 on the 7th guess
    messages = result.trajectory.messages
    assert messages[0]["role"] == "user" and "secret whole number" in messages[0]["content"]
    assert messages[-1] == {"role": "tool", "tool_call_id": messages[-2]["tool_calls"][0]["id"], "content": "correct"}
    assert model.tools[0][0]["function"]["name"] == "guess"  # the server's flat tool, as a chat tool
    # one seed, a step per guess (all calls of a round in one request), verify, then close exactly once
    assert game.paths() == ["/seed_session"] + ["/step"] * 7 + ["/verify", "/close"]
    for path, body, cookie in game.requests[1:-2]:
        assert body["action"][0]["type"] == "function_call" and json.loads(body["action"][0]["arguments"])
        assert cookie == body["env_id"]  # the session cookie the seed set travels with the rollout's calls
    verify_body = game.requests[-2][1]
    assert verify_body["task_idx"] == 7 and verify_body["response"]["env_id"] == game.requests[1][1]["env_id"]
    assert [i["type"] for i in verify_body["response"]["output"]][:2] == ["function_call", "function_call_output"]
    # the Responses object /verify read is what the rollout returns besides its reward, not a reward detail
    assert result.outputs.response == verify_body["response"] and "response" not in result.reward_details


def test_two_rounds_in_one_step_and_concurrent_rollouts_keep_their_own_sessions(game):
    both = {"tool_calls": [{"name": "guess", "arguments": {"number": 50}},
                           {"name": "guess", "arguments": {"number": secret_for(3)}}]}

    async def two():
        async def one(idx):
            agent = AviaryStepAgent()
            env = AviaryEnvironment(AviaryEnvironmentConfig(url=game.url))
            # the index from the task's data, or from the row the agent server keeps in task.gym
            gym = None if idx == 3 else GymContext(row={"task_idx": idx})
            task = Task(task_id=f"g{idx}", data={"task_idx": idx} if idx == 3 else {}, gym=gym)
            return await run_rollout(task, agent, ScriptedModel([both]), env, verifier=env,
                                     meta=RequestMeta(rollout_id=f"r{idx}", task_id=f"g{idx}"))
        return await asyncio.gather(one(3), one(5))

    hit, miss = asyncio.run(two())
    assert hit.exit_reason == ExitReason.ENVIRONMENT_DONE and hit.reward == 1.0
    step = hit.trajectory.steps[0]
    assert [o.content for o in step.observations] == ["higher", "correct"]
    assert [m["role"] for m in hit.trajectory.messages] == ["user", "assistant", "tool", "tool"]
    assert miss.status == "infra_failed" and miss.exit_reason == ExitReason.MODEL_ERROR  # out of outputs
    steps = [(body["env_id"], cookie) for path, body, cookie in game.requests if path == "/step"]
    assert len(steps) == 2 and all(env_id == cookie for env_id, cookie in steps) and steps[0][0] != steps[1][0]
    assert sorted(body["task_idx"] for path, body, _ in game.requests if path == "/seed_session") == [3, 5]
    assert game.paths().count("/close") == 2


def test_a_reply_without_tool_calls_ends_the_episode_by_default(game):
    result, _ = run(game, ["I would rather not play."])
    assert result.status == "completed" and result.exit_reason == ExitReason.NATURAL_COMPLETION
    assert result.submission == "I would rather not play." and result.reward == 0.0
    assert game.paths() == ["/seed_session", "/verify", "/close"]


def test_without_done_if_no_tool_calls_a_corrective_message_asks_for_a_tool_call(game):
    result, model = run(game, ["Let me think.", guess(secret_for(7))], done_if_no_tool_calls=False)
    assert result.exit_reason == ExitReason.ENVIRONMENT_DONE and result.reward == 1.0
    corrective = model.prompts[1][-1]
    assert corrective["role"] == "user" and "called no tool" in corrective["content"]
    assert result.trajectory.steps[0].format_error and result.trajectory.steps[1].format_error is None
    assert game.paths().count("/step") == 1


def test_replies_without_tool_calls_cannot_loop_forever(game):
    result, _ = run(game, ["no"] * 10, done_if_no_tool_calls=False, max_consecutive_format_errors=3)
    assert result.status == "completed" and result.exit_reason == ExitReason.FORMAT_ERRORS
    assert len(result.trajectory.steps) == 3 and "/step" not in game.paths()


def test_max_steps_ends_with_a_partial_rollout(game):
    result, _ = run(game, max_steps=3)
    assert result.status == "completed" and result.exit_reason == ExitReason.STEP_LIMIT
    assert len(result.trajectory.steps) == 3 and result.reward == 0.0
    assert [m["content"] for m in result.trajectory.messages if m["role"] == "tool"] == ["lower", "higher", "lower"]
    assert game.paths().count("/step") == 3 and game.paths()[-1] == "/close"


def test_max_total_sequence_length_stops_before_the_prompt_that_would_not_fit(game):
    full, _ = run(game)
    totals = [s.usage.prompt_tokens + s.usage.completion_tokens for s in full.trajectory.steps]
    limit = (totals[1] + totals[2]) // 2
    result, model = run(game, max_total_sequence_length=limit)
    assert result.status == "completed" and result.exit_reason == ExitReason.TOKEN_LIMIT
    assert len(result.trajectory.steps) == 3 and model.calls == 3  # the 4th prompt was never sent
    assert totals[1] < limit <= result.trajectory.steps[-1].usage.total_tokens
    assert "max_total_sequence_length" in result.trajectory.exit_message
    assert result.trajectory.messages[-1]["role"] == "tool"  # the last guess was played and answered


def test_collapse_old_env_states_shows_the_model_only_the_latest_state(stateful_game):
    hidden = "[older state hidden]"
    result, model = run(stateful_game, collapse_old_env_states=True, old_env_state_message=hidden, max_steps=4)
    last_prompt = model.prompts[-1]
    states = [m["content"] for m in last_prompt if (m["content"] or "").startswith("State:")]
    assert states == ["State: 3 guesses made"]
    assert [m["content"] for m in last_prompt].count(hidden) == 3  # the opening state and two after steps
    assert len(last_prompt) == len(result.trajectory.messages) - 3  # replaced, never dropped (the last turn: 3)
    kept = [m["content"] for m in result.trajectory.messages if (m["content"] or "").startswith("State:")]
    assert kept == [f"State: {n} guesses made" for n in range(5)]  # the trajectory keeps every state
    # the tool replies come first, then the state, and binary search still played on the collapsed prompts
    assert [m["role"] for m in result.trajectory.messages[2:5]] == ["assistant", "tool", "user"]
    assert [m["content"] for m in result.trajectory.messages if m["role"] == "tool"] == [
        "lower", "higher", "lower", "lower"]
    assert [b["turn"] for b in result.metadata["token_breaks"]] == [2, 3, 4]  # no prompt extends the one before


def test_without_collapse_the_model_sees_every_state(stateful_game):
    result, model = run(stateful_game, max_steps=3)
    states = [m["content"] for m in model.prompts[-1] if (m["content"] or "").startswith("State:")]
    assert states == ["State: 0 guesses made", "State: 1 guesses made", "State: 2 guesses made"]
    assert result.metadata["token_breaks"] == []  # every prompt extends the one before


def drive(game, policy=binary_search, task_idx=7, **config):
    """The agent stepped by a caller that owns generation (``session``): request → the caller's model → step."""
    agent = AviaryStepAgent(AviaryStepAgentConfig(**config))
    env = AviaryEnvironment(AviaryEnvironmentConfig(url=game.url, timeout=10, cleanup_timeout=5))
    task = Task(task_id=f"game-{task_idx}",
                data={"row": {"task_idx": task_idx, "responses_create_params": {"input": []}}})
    model = Recording(policy=policy)

    async def go():
        session = agent.session(env)
        try:
            await session.reset(task)
            while session.should_continue():
                request = session.request()
                await session.step(await model.complete(request.messages, request.tools))
        finally:
            await env.close()
        return session.ctx.trajectory

    return asyncio.run(go()), model


def without_call_ids(prompts):
    return json.loads(re.sub(r"call_\d+", "call_N", json.dumps(prompts)))


def test_a_caller_is_shown_the_collapsed_prompt_the_loop_shows_the_model(stateful_game):
    hidden = "[older state hidden]"
    looped, loop_model = run(stateful_game, collapse_old_env_states=True, old_env_state_message=hidden, max_steps=4)
    trajectory, model = drive(stateful_game, collapse_old_env_states=True, old_env_state_message=hidden, max_steps=4)
    states = [m["content"] for m in model.prompts[-1] if (m["content"] or "").startswith("State:")]
    assert states == ["State: 3 guesses made"]
    assert [m["content"] for m in model.prompts[-1]].count(hidden) == 3
    kept = [m["content"] for m in trajectory.messages if (m["content"] or "").startswith("State:")]
    assert kept == [f"State: {n} guesses made" for n in range(5)]  # the trajectory keeps every state
    assert without_call_ids(model.prompts) == without_call_ids(loop_model.prompts)
    assert trajectory.exit_reason == looped.exit_reason == ExitReason.STEP_LIMIT


def test_a_caller_is_stopped_by_max_total_sequence_length_before_the_prompt_that_would_not_fit(game):
    full, _ = run(game)
    totals = [s.usage.prompt_tokens + s.usage.completion_tokens for s in full.trajectory.steps]
    limit = (totals[1] + totals[2]) // 2
    trajectory, model = drive(game, max_total_sequence_length=limit)
    assert trajectory.exit_reason == ExitReason.TOKEN_LIMIT and "max_total_sequence_length" in trajectory.exit_message
    assert len(trajectory.steps) == 3 and model.calls == 3  # should_continue said no before a 4th generation
    assert trajectory.steps[-1].termination_reason == ExitReason.TOKEN_LIMIT
    assert trajectory.messages[-1]["role"] == "tool"  # the last guess was played and answered


def test_one_agent_plays_concurrent_episodes_each_with_its_own_states(stateful_game):
    """The agent is shared by the rollouts of a worker; what one episode remembers is not another's."""
    agent = AviaryStepAgent(AviaryStepAgentConfig(collapse_old_env_states=True, max_steps=3))
    models = [Recording(policy=binary_search) for _ in range(2)]

    async def both():
        async def one(idx, model):
            env = AviaryEnvironment(AviaryEnvironmentConfig(url=stateful_game.url, timeout=10, cleanup_timeout=5))
            task = Task(task_id=f"g{idx}", data={"row": {"task_idx": idx}})
            return await run_rollout(task, agent, model, env, limits=agent.limits(),
                                     meta=RequestMeta(rollout_id=f"r{idx}", task_id=task.task_id))
        return await asyncio.gather(one(3, models[0]), one(7, models[1]))

    results = asyncio.run(both())
    assert [r.exit_reason for r in results] == [ExitReason.STEP_LIMIT] * 2
    for model in models:
        states = [m["content"] for m in model.prompts[-1] if (m["content"] or "").startswith("State:")]
        assert states == ["State: 2 guesses made"]
    assert agent.states == {}  # the shared agent remembers nothing


def test_a_step_500_is_an_observation_and_the_episode_goes_on(game):
    game.fail["/step"] = [500]
    result, model = run(game)
    assert result.status == "completed" and result.exit_reason == ExitReason.ENVIRONMENT_DONE
    first = result.trajectory.steps[0].observations[0]
    assert not first.success and "game engine is down" in first.content and first.info["status"] == 500
    assert "game engine is down" in model.prompts[1][-1]["content"]
    assert result.reward == 1.0 and game.paths().count("/close") == 1


def test_a_verify_failure_is_infrastructure_never_a_zero_reward(game):
    game.fail["/verify"] = [500]
    result, _ = run(game)
    assert result.status == "infra_failed" and result.exit_reason == ExitReason.VERIFIER_ERROR
    assert result.reward is None and result.error.infrastructure and result.error.retryable
    assert game.paths()[-2:] == ["/verify", "/close"]


def test_a_seed_failure_is_an_environment_failure(game):
    game.fail["/seed_session"] = [503]
    result, model = run(game)
    assert result.status == "infra_failed" and result.exit_reason == ExitReason.ENVIRONMENT_ERROR
    assert model.calls == 0 and game.paths() == ["/seed_session"]


def test_an_unreachable_server_is_an_environment_failure(game):
    with serve_in_thread(create_app()) as gone:
        url = gone.url
    result, _ = run(game, url=url)
    assert result.status == "infra_failed" and result.exit_reason == ExitReason.ENVIRONMENT_ERROR
    assert result.reward is None


def test_close_is_posted_once_when_the_episode_fails(game):
    result, _ = run(game, [guess(50), guess(25)])  # the model runs out of outputs: a model error
    assert result.status == "infra_failed" and result.exit_reason == ExitReason.MODEL_ERROR
    assert game.paths() == ["/seed_session", "/step", "/step", "/close"]
    assert game.requests[-1][1] == {"env_id": game.requests[1][1]["env_id"]}


def test_registered_short_names():
    assert AGENTS.load("aviary") is AviaryStepAgent
    assert ENVIRONMENTS.load("aviary") is AviaryEnvironment
