"""ResourcesEnvironment: any NeMo-Gym-style resources server as an Environment and its Verifier (the Simple
agent's side of the contract).

Per rollout: ``POST /seed_session`` (the row in the legacy contract; a typed ``ResourcesSeedSessionRequest`` in
the episode contract), ``POST /<tool_name>`` with the call's JSON arguments for every tool call, ``POST /verify``
with the row and the rollout as a Responses object, ``POST /close_session`` always (failures included, bounded by
``cleanup_timeout``). Cookies the server sets travel with every later call of the rollout, never to another.

What the task carries: ``task.gym`` (``rollout.records.GymContext``, written by the agent server or the collection
CLI): the mode (``legacy``, ``episode``, or ``responses`` — the tool loop alone: no seed, verify or close), the row
(the verify body's base), the caller's cookies, and in the episode contract its ids and ``task_data``. What the
rollout returns besides its reward goes on ``result.outputs``: the Responses object ``/verify`` read, and after a
``responses`` rollout the server's cookies; such a rollout has no verdict (``Reward.value`` None: unscored).

Errors: a tool answering 5xx, or a tool name the request did not offer, is an observation the model reads and
the loop goes on; a seed that fails or an unreachable server is ``SeedFailed``/``EnvironmentFailure``
(infrastructure, retried); a failed ``/verify`` is ``VerifierError`` — never a 0 reward.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from envs.resources.http_client import ResourcesHttp
from rollout.config.load import StrictModel
from rollout.errors import EnvironmentFailure
from rollout.protocols import EnvironmentCapabilities, EnvReset
from rollout.records import Action, GymContext, Observation, Reward, RolloutOutputs, RolloutResult, Task
from rollout.wire.responses import chat_tools
from rollout.wire.responses_items import result_response

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


class ResourcesEnvironment(EnvironmentCapabilities):
    closes_sessions = True
    """``/close_session`` ends the server's session: it takes the agent server's ``gym.cleanup_timeout``."""

    def __init__(self, config: ResourcesEnvironmentConfig):
        self.config = config
        self.url = config.url.rstrip("/")
        self.http = ResourcesHttp(self.url, config.timeout)
        self.gym = GymContext()
        self.tool_names: set[str] = set()
        self.seeded = False
        self.closed = False
        self._session_id: str | None = None

    @classmethod
    def from_config(cls, config: ResourcesEnvironmentConfig) -> "ResourcesEnvironment":
        return cls(config)

    # ---- the Environment seam --------------------------------------------------------------------------

    async def reset(self, task: Task) -> EnvReset:
        self.gym = task.gym or GymContext()
        self.http = ResourcesHttp(self.url, self.config.timeout, self.gym.cookies)
        tools = chat_tools(self.gym.request.get("tools"))
        self.tool_names = {t["function"]["name"] for t in tools or []}
        if self.gym.verified:
            body = self.gym.row if self.gym.mode == "legacy" else {
                "resources_session_id": self.session_id, "episode_id": self.gym.episode_id,
                "task_id": self.gym.task_id, "task_data": self.gym.task_data}
            try:
                status, text = await self.http.call("seed_session", body)
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
            self._session_id = f"{self.gym.session_id or 'session'}.{uuid.uuid4().hex[:8]}"
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
        status, text = await self.http.call(name, action.arguments)
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
                body = ({"resources_session_id": self.session_id, "episode_id": self.gym.episode_id}
                        if self.gym.mode == "episode" else {})
                try:
                    await self.http.call("close_session", body, self.config.cleanup_timeout)
                except EnvironmentFailure:
                    pass  # the server's own TTL ends what it could not hear about
        finally:
            await self.http.close()

    # ---- the Verifier seam -----------------------------------------------------------------------------

    def response(self, result: RolloutResult) -> dict[str, Any]:
        """The rollout as a Responses object (what ``/verify`` reads and ``/run`` returns)."""
        return result_response(result, self.gym.request)

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        response = self.response(result)
        if not self.gym.verified:  # the tool loop alone: the caller's session goes on with the server's cookies
            result.outputs = RolloutOutputs(response=response, cookies=self.http.current_cookies())
            return Reward(value=None, details={"verified": False})
        result.outputs = RolloutOutputs(response=response)
        verdict = await self.http.verify({**self.gym.row, "response": response})
        return Reward(value=verdict["reward"], details={"verified": True, "verify_response": verdict})
