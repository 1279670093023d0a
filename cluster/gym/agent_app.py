"""The NeMo-Gym-compatible agent server: a FastAPI app over a ``RolloutFarm``, so every episode runs on the farm's
workers with its limits, retries, metrics and live view.

Routes:
- ``POST /run``, legacy body (a row: ``responses_create_params`` + task fields): seed → tool loop → verify; answers
  the verify response (the row's fields, ``response``: a Responses object with ``message``/``function_call``/
  ``function_call_output`` items and the engine's token ids on the model's items, ``reward``, ``mask_sample``,
  ``failure_kind``, ``failure_reason``). A rollout whose model or environment kept failing after the farm's
  retries: HTTP 502 ``{"error": {"type", "message"}}``; a body we cannot read: 422; no place within
  ``queue_timeout``: 503.
- ``POST /run``, episode body (NeMo Gym 0.7.0: ``{episode_id, task}``): always 200 with ``{episode_id, task_id}``
  and exactly one of ``result`` (the verify response) or ``failure`` (``cluster.gym.rows.FAILURES``).
- ``POST /v1/responses``: the tool loop alone on a Responses request (tools called with the caller's cookies;
  no seed, no verify: the rollout is unscored); 501 for agents whose class says they do not speak it
  (``speaks_responses_api = False``: the Mini SWE agent, as NeMo Gym's).
- ``GET /health``; the per-rollout model gateway's routes when one is configured.

Access: with a token (``gym.token``, or the one generated when ``gym.host`` is not loopback) every route but
``/health`` answers 401 to a request without ``Authorization: Bearer <token>`` (``rollout.access.AccessGuard``);
``/health`` then says only ``{"status": "ok"}``.

Limits: ``max_concurrent_episodes`` (the rest wait up to ``queue_timeout``), ``episode_timeout`` (the farm's
deadline for the call: retries included), ``max_body_bytes`` (413 while a larger body arrives). A Responses field of
the wrong type is refused before any work (422 naming it). A client that disconnects ends its episode: cancelled on
the farm, its containers removed.
"""

import asyncio
import json
from typing import Any

from cluster.config.gym_section import GymSection
from cluster.gym.request_guards import BodyLimit, ClientGone, while_connected
from cluster.gym.rows import RowError, episode_reply, episode_task, failure_of, legacy_task, verify_reply
from rollout.access import AccessGuard
from rollout.protocols import AgentCapabilities, declared
from rollout.records import RolloutResult, Task
from rollout.waits import within


class Admission:
    """At most ``limit`` episodes at once; a waiter gives up after ``timeout`` seconds."""

    def __init__(self, limit: int | None, timeout: float):
        self.semaphore = asyncio.Semaphore(limit) if limit else None
        self.timeout = timeout
        self.waiting = 0

    async def enter(self) -> bool:
        if self.semaphore is None:
            return True
        self.waiting += 1
        try:
            await within(self.semaphore.acquire(), self.timeout)  # a client's cancel is never lost (rollout.waits)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self.waiting -= 1

    def leave(self) -> None:
        if self.semaphore is not None:
            self.semaphore.release()


class EpisodeRunner:
    """One task through the farm (from the server's event loop), and what the farm's profiles are."""

    def __init__(self, farm: Any, settings: GymSection):
        self.farm, self.settings = farm, settings
        profiles = farm.profiles()
        self.profiles = [name for name in profiles if name is not None]
        self.responses_api = {name: declared(p.agent, AgentCapabilities).speaks_responses_api
                              for name, p in profiles.items()}
        self._keys = 0

    def next_key(self, prefix: str) -> str:
        self._keys += 1
        return f"{prefix}-{self._keys}"

    def speaks_responses_api(self, task: Task) -> bool:
        """Whether the agent of the task's profile plays the tool loop alone (``/v1/responses``)."""
        return self.responses_api.get(task.data.get("profile"), self.responses_api.get(None, True))

    async def run(self, task: Task) -> RolloutResult:
        future = self.farm.submit([task], 1, deadline=self.settings.episode_timeout)
        batch = await asyncio.wrap_future(future)
        results = [r for group in [*batch.groups, *batch.dropped] for r in group.results]
        if not results:
            raise RuntimeError(f"the farm returned no result for {task.task_id}")
        return results[0]


OPEN_PATHS = ("/health",)
"""Routes that answer without the token (a load balancer's probe)."""


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Any:
    """``body`` as JSON, encoded by pydantic-core (a /run reply with its logprobs: 75 µs vs the json module's 277)."""
    from pydantic_core import to_json
    from starlette.responses import Response

    return Response(to_json(body), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, kind: str, message: str) -> Any:
    return _json(status, {"error": {"type": kind, "message": message[:4000]}})


async def _body(request: Any) -> Any:
    try:
        return json.loads(await request.body() or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise RowError(f"body: not JSON ({exc})") from None


def build_app(runner: EpisodeRunner, gateway: Any = None) -> Any:
    """The agent server's FastAPI app around ``runner``; ``gateway``: an APIRouter to mount (or None)."""
    from fastapi import FastAPI, Request

    settings = runner.settings
    admission = Admission(settings.max_concurrent_episodes, settings.queue_timeout)
    app = FastAPI(title="rollout-farm agent server")
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(AccessGuard, token=settings.token, service="the agent server", open_paths=OPEN_PATHS)

    @app.get("/health")
    async def health() -> Any:  # open to anyone when a token guards the rest: it reveals nothing then
        return {"status": "ok"} if settings.token else {"status": "ok", "waiting": admission.waiting}

    @app.post("/run")
    async def run(request: Request) -> Any:
        try:
            body = await _body(request)
        except RowError as exc:
            return _error(422, "invalid_request", str(exc))
        if isinstance(body, dict) and "episode_id" in body and "task" in body:
            return await _episode(body, request)
        try:
            task = legacy_task(body, runner.next_key("run"), cookies=dict(request.cookies),
                               profiles=runner.profiles, allow_paths=settings.allow_repo_paths)
        except RowError as exc:
            return _error(422, "invalid_request", str(exc))
        result = await _admitted(task, request)
        if not isinstance(result, RolloutResult):
            return result
        return _json(200, verify_reply(result, task.gym.row))

    async def _attempt(task: Task) -> RolloutResult | None:
        """The episode's result once it has a place; None when none was free within ``queue_timeout``."""
        if not await admission.enter():
            return None
        try:
            return await runner.run(task)
        finally:
            admission.leave()

    async def _admitted(task: Task, request: Request) -> Any:
        """A legacy request's rollout, or its error answer: 503 without a place in time, 502 when it failed (and
        499, which nobody reads, when the client left)."""
        try:
            result = await while_connected(request.receive, _attempt(task))
        except ClientGone:
            return _error(499, "client_closed", "the client disconnected; its episode was cancelled")
        if result is None:
            return _error(503, "admission_timeout", f"no place for the episode within {settings.queue_timeout:g}s")
        if result.status != "completed":
            message = result.error.message if result.error else result.exit_reason.value
            return _error(502, result.exit_reason.value, message)
        return result

    async def _episode(body: dict[str, Any], request: Request) -> Any:
        episode_id = body.get("episode_id")
        task_id = (body.get("task") or {}).get("task_id") if isinstance(body.get("task"), dict) else None
        try:
            task, episode_id, task_id = episode_task(body, runner.profiles, settings.allow_repo_paths)
        except RowError as exc:
            if isinstance(episode_id, dict) and isinstance(task_id, dict):
                return _json(200, episode_reply(episode_id, task_id, failure=failure_of(None, "bad_request",
                                                                                       str(exc))))
            return _error(422, "invalid_request", str(exc))
        try:
            result = await while_connected(request.receive, _attempt(task))
        except ClientGone:
            reason = "the client disconnected; the episode was cancelled"
            return _json(200, episode_reply(episode_id, task_id, failure=failure_of(None, "cancelled", reason)))
        except Exception as exc:  # noqa: BLE001 - an unhandled error is a terminal failure, not a 500
            reason = f"unhandled agent server error: {type(exc).__name__}: {exc}"
            return _json(200, episode_reply(episode_id, task_id, failure=failure_of(None, "internal_error", reason)))
        if result is None:
            reason = f"episode admission timed out after {settings.queue_timeout:g}s"
            return _json(200, episode_reply(episode_id, task_id, failure=failure_of(None, "admission_timeout",
                                                                                   reason)))
        if result.status != "completed" and result.exit_reason.value == "deadline_exceeded":
            reason = f"episode timed out after {settings.episode_timeout:g}s"
            return _json(200, episode_reply(episode_id, task_id, failure=failure_of(result, "episode_timeout",
                                                                                   reason)))
        return _json(200, episode_reply(episode_id, task_id, result, row=task.gym.row))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        try:
            params = await _body(request)
            task = legacy_task({"responses_create_params": params}, runner.next_key("responses"),
                               mode="responses", cookies=dict(request.cookies), profiles=runner.profiles,
                               allow_paths=settings.allow_repo_paths)
        except RowError as exc:
            return _error(422, "invalid_request", str(exc).replace("body.responses_create_params", "body"))
        if not runner.speaks_responses_api(task):
            return _error(501, "not_implemented", "this agent runs whole episodes only: use POST /run")
        result = await _admitted(task, request)
        if not isinstance(result, RolloutResult):
            return result
        reply = _json(200, result.outputs.response)
        for name, value in result.outputs.cookies.items():  # the caller's session goes on with them
            reply.set_cookie(name, value)
        return reply

    if gateway is not None:
        app.include_router(gateway)
    return app
