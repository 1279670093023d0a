"""AviaryEnvironment: a resources server that speaks the Aviary wire, as an Environment and its Verifier.

Per rollout: ``/seed_session`` (the row and its ``task_idx``) answers opening messages, tools and an ``env_id``;
``/step`` takes every tool call of a round at once and answers ``obs`` (``function_call_output`` items and/or
messages), ``reward`` and ``done``; ``/verify`` takes the row and the rollout as a Responses object and answers
its ``reward``; ``/close`` is always sent once (failures included), bounded by ``cleanup_timeout``. Cookies the
server sets travel with the rollout's later calls.

The agent receives one Observation per call (its output, matched by ``call_id``), the round's ``reward`` on the
last, ``done`` on all. Messages sent besides the outputs go on the last one: ``info["messages"]`` (chat messages)
and ``info["env_state"]`` (positions in that list of those holding the environment's state; an agent may collapse
older ones); ``EnvReset.info["env_state"]`` the same for the opening messages.

Errors: a 5xx on ``/step`` is the observation of every call of the round (the loop goes on); an unreachable
server, a timeout, a 4xx on ``/step`` or a failed seed is ``EnvironmentFailure`` (infrastructure); a failed
``/verify`` is ``VerifierError`` — never a 0 reward.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pydantic import Field

from envs.resources.http_client import ResourcesHttp
from rollout.config.load import StrictModel
from rollout.errors import EnvironmentFailure
from rollout.protocols import EnvironmentCapabilities, EnvReset
from rollout.records import Action, Message, Observation, Reward, RolloutOutputs, RolloutResult, Task
from rollout.wire.responses import ResponsesFormatError, chat_messages, chat_tools
from rollout.wire.responses_items import result_response

log = logging.getLogger(__name__)


class AviaryEnvironmentConfig(StrictModel):
    type: str = "aviary"
    url: str
    """Base URL of the resources server (``http://host:port``)."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds one seed, step or verify request may take."""
    cleanup_timeout: float = Field(default=30.0, gt=0)
    """Seconds ``/close`` may take."""


def task_row(task: Task) -> dict[str, Any]:
    """The task's dataset row: ``task.data["row"]``, or the one the agent server keeps in ``task.gym``."""
    row = task.data.get("row") or (task.gym.row if task.gym else None) or {}
    if not isinstance(row, dict):
        raise ValueError(f"field row: an object, not {type(row).__name__}")
    return row


def task_index(task: Task) -> int:
    """The ``task_idx`` the server seeds with: the row's, else ``task.data["task_idx"]``, else a numeric task id."""
    for value in (task_row(task).get("task_idx"), task.data.get("task_idx"), task.task_id):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    raise ValueError("field task_idx: none in the row, the task data or the task id")


def check_row(task: Task) -> None:
    """A row's task index, checked when the dataset loads (the loader adds the line number)."""
    task_index(task)


def input_messages(items: list[Any], where: str) -> tuple[list[Message], list[int]]:
    """Aviary input items as chat messages, and the positions of those that hold an environment state."""
    messages: list[Message] = []
    states: list[int] = []
    for i, item in enumerate(items):
        try:
            converted = chat_messages({"input": [item]})
        except ResponsesFormatError as exc:
            raise EnvironmentFailure(f"{where}[{i}]: not a message or function_call_output item ({exc})") from exc
        if isinstance(item, dict) and item.get("is_env_state"):
            states += range(len(messages), len(messages) + len(converted))
        messages += converted
    return messages, states


class AviaryEnvironment(EnvironmentCapabilities):
    closes_sessions = True
    """``/close`` ends the server's session: it takes the agent server's ``gym.cleanup_timeout``."""
    check_row = staticmethod(check_row)
    """What a row must hold, checked as the dataset loads (``rollout.config.components.ChecksRows``)."""

    def __init__(self, config: AviaryEnvironmentConfig):
        self.config = config
        self.url = config.url.rstrip("/")
        self.row: dict[str, Any] = {}
        self.task_idx: int | None = None
        self.env_id: str | None = None
        self.closed = False
        self.http = ResourcesHttp(self.url, config.timeout)

    # ---- HTTP ------------------------------------------------------------------------------------------

    async def _call(self, path: str, body: Any, timeout: float | None = None) -> tuple[int, str]:
        """(status, text) of one POST; an unreachable server or a timeout is an ``EnvironmentFailure``."""
        return await self.http.call(path, body, timeout)

    @staticmethod
    def _json(path: str, text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("obs", []), list):
            raise EnvironmentFailure(f"/{path} answered no JSON object with an obs list: {text[:500]}")
        return data

    # ---- the Environment seam --------------------------------------------------------------------------

    async def reset(self, task: Task) -> EnvReset:
        self.http = ResourcesHttp(self.url, self.config.timeout, task.gym.cookies if task.gym else None)
        try:
            self.task_idx = task_index(task)
        except ValueError as exc:
            raise EnvironmentFailure(f"task {task.task_id!r}: {exc}", retryable=False) from None
        self.row = dict(task_row(task))
        status, text = await self._call("seed_session", {**self.row, "task_idx": self.task_idx})
        if status >= 300:
            raise EnvironmentFailure(f"/seed_session answered {status}: {text[:1000]}", retryable=status >= 500)
        data = self._json("seed_session", text)
        if not isinstance(data.get("env_id"), (str, int)):
            raise EnvironmentFailure(f"/seed_session answered no env_id: {text[:500]}")
        self.env_id = str(data["env_id"])
        messages, states = input_messages(data.get("obs") or [], "/seed_session obs")
        try:
            tools = chat_tools(data.get("tools"))
        except ResponsesFormatError as exc:
            raise EnvironmentFailure(f"/seed_session {exc}") from exc
        return EnvReset(messages=messages, tools=tools, info={"env_id": self.env_id, "env_state": states})

    async def step(self, actions: list[Action]) -> list[Observation]:
        """One ``/step`` with every call of the round; one observation per call, in order."""
        if not actions:
            return []
        calls = [{"type": "function_call", "call_id": a.call_id or f"call_{i}", "name": a.name,
                  "arguments": a.raw or json.dumps(a.arguments)} for i, a in enumerate(actions)]
        t0 = time.perf_counter()
        status, text = await self._call("step", {"action": calls, "env_id": self.env_id})
        seconds = time.perf_counter() - t0
        if status >= 500:  # the environment failed this round: the model reads why, the loop goes on
            return [Observation(content=text or f"the environment answered {status}", success=False,
                                call_id=a.call_id, action_name=a.name,
                                info={"error": "execution_error", "status": status, "duration": seconds})
                    for a in actions]
        if status >= 300:
            raise EnvironmentFailure(f"/step answered {status}: {text[:1000]}")
        data = self._json("step", text)
        try:
            reward = float(data.get("reward") or 0.0)
        except (TypeError, ValueError):
            raise EnvironmentFailure(f"/step answered a reward that is not a number: {text[:500]}") from None
        outputs, extra = self._outputs([c["call_id"] for c in calls], data.get("obs") or [])
        messages, states = input_messages(extra, "/step obs")
        done = bool(data.get("done"))
        observations = [Observation(content=outputs[i], call_id=a.call_id, action_name=a.name, done=done,
                                    info={"duration": seconds / len(actions)}) for i, a in enumerate(actions)]
        observations[-1].reward = reward
        if messages:
            observations[-1].info.update(messages=messages, env_state=states)
        return observations

    @staticmethod
    def _outputs(call_ids: list[str], obs: list[Any]) -> tuple[list[str], list[Any]]:
        """Each call's output (by ``call_id``; unmatched outputs fill unanswered calls in order) and the rest of
        ``obs`` (messages, and outputs no call is left for, as user messages)."""
        answers: dict[int, str] = {}
        loose: list[str] = []
        extra: list[Any] = []
        for item in obs:
            if not (isinstance(item, dict) and item.get("type") == "function_call_output"):
                extra.append(item)
                continue
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            slot = next((i for i, c in enumerate(call_ids) if c == item.get("call_id") and i not in answers), None)
            if slot is None:
                loose.append(text)
            else:
                answers[slot] = text
        for text in loose:
            slot = next((i for i in range(len(call_ids)) if i not in answers), None)
            if slot is None:
                extra.append({"role": "user", "content": text})
            else:
                answers[slot] = text
        return [answers.get(i, "") for i in range(len(call_ids))], extra

    async def close(self) -> None:
        """``/close`` once for a seeded environment (also after a failure); bounded, never raises."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.env_id is not None:
                status, text = await self._call("close", {"env_id": self.env_id}, self.config.cleanup_timeout)
                if status >= 300:
                    log.warning("aviary /close of %s answered %s: %s", self.env_id, status, text[:300])
        except Exception as exc:  # noqa: BLE001 - cleanup: the episode's result stands
            log.warning("aviary /close of %s failed: %s", self.env_id, exc)
        finally:
            await self.http.close()

    # ---- the Verifier seam -----------------------------------------------------------------------------

    def response(self, result: RolloutResult) -> dict[str, Any]:
        """The rollout as a Responses object, with the ``env_id`` an Aviary server scores by."""
        reply = result_response(result, self.row.get("responses_create_params") or {})
        reply.update(env_id=self.env_id, group_id=str(self.task_idx), contains_transitions=False)
        return reply

    async def verify(self, task: Task, result: RolloutResult) -> Reward:
        response = self.response(result)
        result.outputs = RolloutOutputs(response=response)
        verdict = await self.http.verify({"task_idx": self.task_idx, **self.row, "response": response})
        return Reward(value=verdict["reward"], details={"verified": True, "verify_response": verdict})
