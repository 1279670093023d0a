"""A guess-the-number text game served the Aviary way (seed, step, close) as a NeMo-Gym-style resources server.

``POST /seed_session {"task_idx": int, ...}`` -> ``{"obs": [messages], "tools": [the guess tool], "env_id"}``;
``POST /step {"action": [function_call items], "env_id"}`` -> ``{"obs": [function_call_output items and/or
messages], "reward", "done"}``; ``POST /close {"env_id"}`` (idempotent); ``POST /verify`` -> the reward the server
recorded for the episode. The secret in [1, 100] follows from ``task_idx``; a correct guess scores 1.0 and ends
the game. The typed ``/seed_session`` and ``/close_session`` of ``sessions`` work too (``task_data.task_idx``).

``python -m envs.resources.text_game --port N [--host H]`` serves it."""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from envs.resources.serving import serve_forever
from envs.resources.sessions import (
    SESSION_COOKIE,
    Problem,
    ResourcesServer,
    Session,
    SessionStore,
    build_app,
    json_object,
    output_items,
)

LOW, HIGH = 1, 100
MAX_GUESSES = 20

GUESS_TOOL = {
    "type": "function",
    "name": "guess",
    "description": f"Guess the secret whole number in [{LOW}, {HIGH}]; answers higher, lower or correct.",
    "parameters": {
        "type": "object",
        "properties": {"number": {"type": "integer", "description": f"your guess, {LOW} to {HIGH}"}},
        "required": ["number"],
        "additionalProperties": False,
    },
    "strict": True,
}


def secret_for(task_idx: int) -> int:
    """The secret number of task ``task_idx`` (the same in every process)."""
    return random.Random(f"text-game:{task_idx}").randint(LOW, HIGH)


@dataclass
class Game:
    task_idx: int
    secret: int
    guesses: int = 0
    total_reward: float = 0.0
    done: bool = False


def _task_idx(row: dict) -> int:
    value = row.get("task_idx")
    if isinstance(value, bool) or not isinstance(value, int):
        raise Problem(422, "`task_idx` must be an integer")
    return value


def _output(call_id: str, text: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def _note(text: str) -> dict:
    return {"role": "user", "content": text}


def _answer(game: Game, name: Any, arguments: Any) -> tuple[str, float]:
    """The observation text for one call, and the reward it earns."""
    if game.done:
        return "the game is over: the number was already found or the guesses ran out", 0.0
    if name != GUESS_TOOL["name"]:
        return f"error: there is no tool {name!r}; the only tool is guess", 0.0
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return 'error: the arguments are not JSON; call guess with {"number": <integer>}', 0.0
    number = parsed.get("number") if isinstance(parsed, dict) else None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        return 'error: call guess with {"number": <integer>}', 0.0
    if not LOW <= number <= HIGH:
        return f"error: {number} is outside [{LOW}, {HIGH}]", 0.0
    game.guesses += 1
    if number == game.secret:
        game.done = True
        return "correct", 1.0
    if game.guesses >= MAX_GUESSES:
        game.done = True
        return f"{'higher' if game.secret > number else 'lower'}; that was the last of {MAX_GUESSES} guesses", 0.0
    return ("higher" if game.secret > number else "lower"), 0.0


def play(game: Game, action: list) -> dict:
    """Apply the calls in ``action`` in order: the step's observations, reward and whether the game is over."""
    obs, reward = [], 0.0
    if not action:
        obs.append(_note("no tool call: call guess with a number to play"))
    for item in action:
        call_id = item.get("call_id") if isinstance(item, dict) else None
        if not isinstance(call_id, str) or item.get("type", "function_call") != "function_call":
            obs.append(_note("error: every action item must be a function_call with a string call_id"))
            continue
        text, earned = _answer(game, item.get("name"), item.get("arguments"))
        obs.append(_output(call_id, text))
        reward += earned
    game.total_reward += reward
    return {"obs": obs, "reward": reward, "done": game.done}


def _env_id(body: dict, request: Request) -> Optional[str]:
    env_id = body.get("env_id")
    return env_id if isinstance(env_id, str) and env_id else request.cookies.get(SESSION_COOKIE)


class TextGameServer(ResourcesServer):
    """The game: a session's state is its ``Game``; its id is the ``env_id``."""

    def new_state(self, row: dict) -> Game:
        task_idx = _task_idx(row)
        return Game(task_idx, secret_for(task_idx))

    def seed_reply(self, session: Session) -> dict:
        prompt = (f"I picked a secret whole number between {LOW} and {HIGH}. Find it with the guess tool: "
                  f"each guess is answered higher, lower or correct. You have {MAX_GUESSES} guesses.")
        return {"obs": [_note(prompt)], "tools": [GUESS_TOOL], "env_id": session.id}

    async def verify(self, body: dict, session: Optional[Session]) -> dict:
        output_items(body)
        env_id = body["response"].get("env_id") or body.get("env_id")
        named = self.store.get(env_id) if isinstance(env_id, str) else session
        if named is None or not isinstance(named.state, Game):
            return {"reward": 0.0, "mask_sample": True, "failure_kind": "session_lost",
                    "failure_reason": f"no game {env_id!r} on this server"}
        return {"reward": named.state.total_reward, "env_id": named.id}

    def add_routes(self, app: FastAPI, store: SessionStore) -> None:
        @app.post("/step")
        async def step(request: Request) -> JSONResponse:
            body = await json_object(request)
            env_id = _env_id(body, request)
            session = store.get(env_id)
            if session is None or not isinstance(session.state, Game):
                raise Problem(404, f"no game {env_id!r}: seed one with /seed_session", env_id=env_id)
            if session.closed:
                raise Problem(409, f"game {env_id!r} is closed", env_id=env_id)
            action = body.get("action")
            if not isinstance(action, list):
                raise Problem(422, "`action` must be a list of function_call items")
            async with session.lock:
                return JSONResponse(play(session.state, action))

        @app.post("/close")
        async def close(request: Request) -> JSONResponse:
            env_id = _env_id(await json_object(request), request)
            if not env_id:
                raise Problem(400, "name the game: `env_id` in the body or the session cookie")
            already = store.get(env_id) is not None and store.get(env_id).closed
            await store.close(env_id)
            return JSONResponse({"message": f"game {env_id} {'was already' if already else 'is'} closed",
                                 "success": True, "env_id": env_id})


def create_app() -> FastAPI:
    """The text game as an ASGI app."""
    return build_app(TextGameServer(), title="guess-the-number text game")


def main(argv: Optional[list[str]] = None) -> int:
    summary = __doc__.split("\n")[0].replace("``", "")  # the help shows plain text, not RST markup
    parser = argparse.ArgumentParser(prog="python -m envs.resources.text_game", description=summary)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    serve_forever(create_app(), args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
