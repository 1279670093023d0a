"""Per-rollout sessions for our NeMo-Gym-style resources servers, and the FastAPI app built around them.

``POST /seed_session`` takes a typed seed ``{resources_session_id, episode_id: {rollout_id, attempt}, task_id:
{taskset, task_id}, task_data}`` (the same id and body again: the same session; another body, or an id already
closed, even one never seeded: 409) or, legacy, any other JSON object (an agent's ``/run`` posts its row): a new
session. The reply sets the ``resources_session_id`` cookie; tool, ``/verify`` and ``/close_session`` calls that
carry it reach that session. ``/close_session`` ({resources_session_id, episode_id} or the cookie) is idempotent.
Only the standard library, pydantic, starlette and fastapi are imported here (NeMo Gym's venv imports this)."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SESSION_COOKIE = "resources_session_id"
VERDICT = ("reward", "mask_sample", "failure_kind", "failure_reason")

ToolHandler = Callable[[Optional["Session"], Any], Awaitable[Any]]  # a JSON-able result or a Response


class Problem(Exception):
    """A request the server refuses: becomes ``status`` with ``{"detail": message, ...extra}`` as JSON."""

    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.body = status, {"detail": message, **extra}


class EpisodeRef(BaseModel):  # the typed contract's shapes, checked here so that no NeMo Gym import is needed
    model_config = ConfigDict(extra="forbid")
    rollout_id: str = Field(min_length=1)
    attempt: int = Field(default=0, ge=0)


class TaskRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class TypedSeed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeRef
    task_id: TaskRef
    task_data: dict[str, Any]


class TypedClose(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeRef


@dataclass
class Session:
    """One rollout's record: its id, the row it was seeded with, the server's state for it, whether it is closed."""

    id: str
    lock: asyncio.Lock
    row: dict
    state: Any = None
    seed_key: Optional[str] = None  # canonical JSON of a typed seed body; None for a legacy seed
    episode: Optional[dict] = None
    closed: bool = False


class SessionStore:
    """Sessions by id, with one asyncio lock per id; closed ids are remembered so a late seed cannot revive them."""

    def __init__(self, new_state: Callable[[dict], Any], release: Callable[[Any], Any] = lambda state: None):
        self._new_state, self._release = new_state, release
        self._sessions: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    def get(self, session_id: Optional[str]) -> Optional[Session]:
        return self._sessions.get(session_id) if session_id else None

    async def _build(self, session_id: str, row: dict, **fields: Any) -> Session:
        state = self._new_state(row)
        if asyncio.iscoroutine(state):
            state = await state
        session = self._sessions[session_id] = Session(session_id, self.lock(session_id), row, state, **fields)
        return session

    async def seed_legacy(self, row: dict) -> Session:
        return await self._build(uuid.uuid4().hex, row)

    async def seed_typed(self, seed: TypedSeed) -> Session:
        key = json.dumps(seed.model_dump(mode="json"), sort_keys=True)
        async with self.lock(seed.resources_session_id):
            existing = self._sessions.get(seed.resources_session_id)
            if existing is not None and (existing.closed or existing.seed_key != key):
                why = "is closed; seed a new id" if existing.closed else "was seeded with another body"
                raise Problem(409, f"session {existing.id!r} {why}", resources_session_id=existing.id)
            if existing is not None:
                return existing
            return await self._build(seed.resources_session_id, seed.task_data, seed_key=key,
                                     episode=seed.episode_id.model_dump())

    async def close(self, session_id: str, episode: Optional[dict] = None) -> Session:
        async with self.lock(session_id):
            session = self._sessions.get(session_id)
            if session is None:  # never seeded: remember the id so that a racing seed cannot create it later
                session = self._sessions[session_id] = Session(session_id, self.lock(session_id), {}, closed=True)
                return session
            if episode is not None and session.episode is not None and episode != session.episode:
                raise Problem(409, f"session {session_id!r} belongs to episode {session.episode}, not {episode}",
                              resources_session_id=session_id)
            if not session.closed:
                released = self._release(session.state)
                if asyncio.iscoroutine(released):
                    await released
                session.closed = True
            return session


class ResourcesServer:
    """What a server supplies; ``build_app`` serves it and sets ``store``. Override what the server needs:
    ``new_state(row)``, the per-session state from the row (a legacy seed body, or a typed seed's ``task_data``);
    ``release(state)`` (may be async) frees it at close, the record staying for ``/verify``; ``seed_reply(session)``
    answers a legacy seed; ``tools()`` maps names to ``async handler(session or None, arguments)`` served at
    ``POST /<name>``; ``verify(body, session)`` gives the fields to add to the body, ``reward`` at least;
    ``add_routes(app, store)`` adds any other route."""

    store: Optional[SessionStore] = None

    def new_state(self, row: dict) -> Any:
        return None

    def release(self, state: Any) -> Any:
        return None

    def seed_reply(self, session: Session) -> dict:
        return {}

    def tools(self) -> dict[str, ToolHandler]:
        return {}

    async def verify(self, body: dict, session: Optional[Session]) -> dict:
        raise NotImplementedError

    def add_routes(self, app: FastAPI, store: SessionStore) -> None:
        return None


async def json_object(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as error:
        raise Problem(422, f"the body is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise Problem(422, "the body must be a JSON object")
    return body


def _typed(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise Problem(422, f"not a {model.__name__}: {error}") from error


def output_items(body: dict) -> list[dict]:
    """``body["response"]["output"]`` checked to be a list of typed items; a 422 otherwise."""
    response = body.get("response")
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        raise Problem(422, "`response` must be a Responses API object with an `output` list")
    items = response["output"]
    if not all(isinstance(item, dict) and isinstance(item.get("type"), str) for item in items):
        raise Problem(422, "every item of `response.output` must be an object with a string `type`")
    return items


def _with_cookie(body: Any, session: Session) -> JSONResponse:
    response = JSONResponse(body)
    response.set_cookie(SESSION_COOKIE, session.id, httponly=True, samesite="lax")
    return response


def _tool_route(handler: ToolHandler, store: SessionStore) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        named = request.cookies.get(SESSION_COOKIE)
        session = store.get(named)
        if named and session is None:
            raise Problem(404, f"no session {named!r} on this server (seed one first)", resources_session_id=named)
        if session is not None and session.closed:
            raise Problem(409, f"session {session.id!r} is closed", resources_session_id=session.id)
        try:
            arguments = json.loads(await request.body() or b"{}")
        except ValueError:
            arguments = None
        result = await handler(session, arguments)
        return result if isinstance(result, Response) else JSONResponse(result)
    return route


def build_app(server: ResourcesServer, title: str = "resources server") -> FastAPI:
    """A FastAPI app serving ``server``: ``/seed_session``, ``/close_session``, ``/verify`` and its tools."""
    app = FastAPI(title=title)
    store = server.store = app.state.sessions = SessionStore(server.new_state, server.release)

    async def refuse(_request: Request, problem: Any) -> Response:
        return JSONResponse(problem.body, status_code=problem.status)

    app.add_exception_handler(Problem, refuse)

    @app.post("/seed_session")
    async def seed_session(request: Request) -> Response:
        body = await json_object(request)
        if "resources_session_id" not in body:
            session = await store.seed_legacy(body)
            return _with_cookie(server.seed_reply(session), session)
        session = await store.seed_typed(_typed(TypedSeed, body))
        return _with_cookie({"resources_session_id": session.id}, session)

    @app.post("/close_session")
    async def close_session(request: Request) -> Response:
        body, cookie = await json_object(request), request.cookies.get(SESSION_COOKIE)
        if body.get("episode_id") is not None or (body.get("resources_session_id") and not cookie):
            close = _typed(TypedClose, body)
            session = await store.close(close.resources_session_id, close.episode_id.model_dump())
        elif cookie:  # legacy: the session the cookie names
            session = await store.close(cookie)
        else:
            raise Problem(400, "name the session: a `resources_session_id` in the body or the session cookie")
        return JSONResponse({"resources_session_id": session.id})

    @app.post("/verify")
    async def verify(request: Request) -> Response:
        body = await json_object(request)
        fields = await server.verify(body, store.get(request.cookies.get(SESSION_COOKIE)))
        echoed = {key: value for key, value in body.items() if key not in VERDICT}  # the verdict is ours alone
        return JSONResponse({**echoed, **fields, "reward": float(fields["reward"])})

    for name, handler in server.tools().items():
        app.post(f"/{name}")(_tool_route(handler, store))
    server.add_routes(app, store)
    return app
