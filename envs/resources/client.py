"""ResourcesEnvironment: any NeMo-Gym-style resources server as an Environment and its Verifier (the Simple
agent's side of the contract).

Per rollout: ``POST /seed_session`` (the row in the legacy contract; a typed ``ResourcesSeedSessionRequest`` in
the episode contract), ``POST /<tool_name>`` with the call's JSON arguments for every tool call, ``POST /verify``
with the row and the rollout as a Responses object, ``POST /close_session`` always (failures included, bounded by
``cleanup_timeout``). Cookies the server sets travel with every later call of the rollout, never to another.

What the task carries (``task.data["gym"]``, written by the agent server or the collection CLI): ``mode``
(``legacy``, ``episode``, or ``responses`` — the tool loop alone: no seed, verify or close), ``row`` (the verify
body's base: the row's fields and ``responses_create_params``), ``cookies`` (the caller's), and in the episode
contract ``episode_id``, ``task_id``, ``task_data``.

Errors: a tool answering 5xx, or a tool name the request did not offer, is an observation the model reads and
the loop goes on; a seed that fails or an unreachable server is ``SeedFailed``/``EnvironmentFailure``
(infrastructure, retried); a failed ``/verify`` is ``VerifierError`` — never a 0 reward.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from http.cookies import SimpleCookie
from typing import Any

from rollout.config import StrictModel
from rollout.errors import EnvironmentFailure, VerifierError
from rollout.models.responses_items import result_response
from rollout.models.responses_wire import chat_tools
from rollout.protocols import EnvReset
from rollout.records import Action, Observation, Reward, RolloutResult, Task

TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
RESERVED = frozenset({"seed_session", "close_session", "verify", "aggregate_metrics", "step", "close"})
"""Routes of the server itself: never reachable as a tool, whatever the request offers."""


class SeedFailed(EnvironmentFailure):
    """``/seed_session`` failed (the episode contract's ``seed`` stage)."""


class ResourcesEnvironmentConfig(StrictModel):
    type: str = "resources"
    url: str
    """Base URL of the resources server (``http://host:port``)."""
    timeout: float = 300.0
    """Seconds one seed, tool or verify call may take."""
    cleanup_timeout: float = 30.0
    """Seconds ``/close_session`` may take."""


class ResourcesEnvironment:
    def __init__(self, config: ResourcesEnvironmentConfig):
        self.config = config
        self.url = config.url.rstrip("/")
        self.cookies: dict[str, str] = {}
        self.gym: dict[str, Any] = {}
        self.tool_names: set[str] = set()
        self.seeded = False
        self.closed = False
        self._session: Any = None
        self._session_id: str | None = None

    @classmethod
    def from_config(cls, config: ResourcesEnvironmentConfig) -> "ResourcesEnvironment":
        return cls(config)

    # ---- HTTP ------------------------------------------------------------------------------------------

    async def _post(self, path: str, body: Any, timeout: float) -> tuple[int, str]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        async with self._session.post(f"{self.url}/{path}", json=body, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text(errors="replace")
            for raw in resp.headers.getall("Set-Cookie", []):
                jar: SimpleCookie = SimpleCookie()
                jar.load(raw)
                self.cookies.update({k: m.value for k, m in jar.items()})
            return resp.status, text

    async def _call(self, path: str, body: Any, timeout: float | None = None) -> tuple[int, str]:
        """(status, text); an unreachable server or a timeout is an ``EnvironmentFailure``."""
        try:
            return await self._post(path, body, timeout or self.config.timeout)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise EnvironmentFailure(f"resources server {self.url}/{path}: no answer in "
                                     f"{timeout or self.config.timeout:g}s") from exc
        except OSError as exc:
            raise EnvironmentFailure(f"resources server {self.url}/{path} unreachable: {exc}") from exc
        except Exception as exc:  # aiohttp.ClientError and friends
            if type(exc).__module__.startswith("aiohttp"):
                raise EnvironmentFailure(f"resources server {self.url}/{path}: {type(exc).__name__}: {exc}") from exc
            raise

    # ---- the Environment seam --------------------------------------------------------------------------

    async def reset(self, task: Task) -> EnvReset:
        self.gym = dict(task.data.get("gym") or {})
        row = self.gym.get("row") or {}
        params = row.get("responses_create_params") or {}
        self.cookies = {str(k): str(v) for k, v in (self.gym.get("cookies") or {}).items()}
        tools = chat_tools(params.get("tools"))
        self.tool_names = {t["function"]["name"] for t in tools or []}
        mode = self.gym.get("mode", "legacy")
        if mode != "responses":
            body = row if mode == "legacy" else {
                "resources_session_id": self.session_id, "episode_id": self.gym.get("episode_id"),
                "task_id": self.gym.get("task_id"), "task_data": self.gym.get("task_data") or {}}
            try:
                status, text = await self._call("seed_session", body)
            except EnvironmentFailure as exc:
                raise SeedFailed(str(exc)) from exc
            if status >= 300:
                raise SeedFailed(f"/seed_session answered {status}: {text[:1000]}", retryable=status >= 500)
            self.seeded = True
        return EnvReset(tools=tools)

    @property
    def session_id(self) -> str:
        """This attempt's ``resources_session_id``: the episode's key and a suffix of its own, since a session once
        closed cannot be seeded again and the farm's retry of a failed attempt needs a fresh one."""
        if self._session_id is None:
            self._session_id = f"{self.gym.get('session_id') or 'session'}.{uuid.uuid4().hex[:8]}"
        return self._session_id

    async def step(self, actions: list[Action]) -> list[Observation]:
        return [await self._tool(action) for action in actions]

    async def _tool(self, action: Action) -> Observation:
        def obs(content: str, success: bool = True, error: str | None = None, **info: Any) -> Observation:
            return Observation(content=content, success=success, call_id=action.call_id, action_name=action.name,
                               info={**({"error": error} if error else {}), **info})

        name = action.name
        if name not in self.tool_names or name in RESERVED or not TOOL_NAME.fullmatch(name):
            offered = ", ".join(sorted(self.tool_names)) or "none"
            return obs(f"Error: unknown tool {name!r}; the tools are: {offered}", False, "unknown_tool")
        t0 = time.perf_counter()
        status, text = await self._call(name, action.arguments)
        seconds = time.perf_counter() - t0
        if status >= 400:  # a tool's failure is its output: the model reads it and the loop goes on
            kind = "invalid_arguments" if status == 422 else "execution_error"
            return obs(text, False, kind, status=status, duration=seconds)
        return obs(text, status=status, duration=seconds)

    async def close(self) -> None:
        """``/close_session`` once, for every seeded session (also after a failure); bounded, never raises."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.seeded:
                # the episode contract closes by id; a legacy seed's session is the one its cookie names
                body = ({"resources_session_id": self.session_id, "episode_id": self.gym.get("episode_id")}
                        if self.gym.get("mode") == "episode" else {})
                try:
                    await self._call("close_session", body, self.config.cleanup_timeout)
                except EnvironmentFailure:
                    pass  # the server's own TTL ends what it could not hear about
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None

    # ---- the Verifier seam -----------------------------------------------------------------------------

    def response(self, result: RolloutResult) -> dict[str, Any]:
        """The rollout as a Responses object (what ``/verify`` reads and ``/run`` returns)."""
        return result_response(result, (self.gym.get("row") or {}).get("responses_create_params") or {})

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        response = self.response(result)
        if self.gym.get("mode") == "responses":
            return Reward(value=0.0, details={"verified": False, "response": response})
        body = {**(self.gym.get("row") or {}), "response": response}
        try:
            status, text = await self._call("verify", body)
        except EnvironmentFailure as exc:
            raise VerifierError(str(exc)) from exc
        if status >= 300:
            raise VerifierError(f"/verify answered {status}: {text[:1000]}", retryable=status >= 500)
        try:
            verdict = json.loads(text)
            reward = float(verdict["reward"])
        except (ValueError, KeyError, TypeError) as exc:
            raise VerifierError(f"/verify answered without a numeric reward: {text[:500]}") from exc
        if not math.isfinite(reward):
            raise VerifierError(f"/verify answered a reward of {reward}")
        return Reward(value=reward, details={"verified": True, "verify_response": verdict, "response": response})
