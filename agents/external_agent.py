"""ExternalAgent: an outside agent that only speaks OpenAI (a CLI coding agent), farmed through the model gateway.

Its ``command`` runs once in the rollout's runtime with ``OPENAI_BASE_URL=<gateway_url>/rollouts/<rollout id>/v1``
and ``OPENAI_API_KEY`` set (also ``ROLLOUT_ID``, ``ROLLOUT_TASK_ID`` and ``ROLLOUT_PROMPT``, the task's request,
which is on its standard input too). It runs in the environment's runtime when the environment declares one
(``rollout.protocols.HasRuntime``: ``envs.shell_env``, ``envs.swe``), with the environment's variables under the
agent's own; an environment without one gets the command as a bash action through ``step``.
Afterwards the calls the gateway recorded (``GET /rollouts/<id>/calls``) become the trajectory's steps, token data
included (``calls_to_steps``), and the gateway forgets them. The ``model`` argument is not used: the calls go to
the gateway, whose upstream is the model.

Outcome: natural completion when the command exits, whatever its code (a non-zero code is named in the
trajectory's ``exit_message``, with the output's tail); the time limit when it timed out. A gateway that cannot
be reached is a ``ModelError`` (infrastructure, retried).
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import uuid
from typing import Any, Literal, Mapping
from urllib.parse import quote

import aiohttp
from pydantic import Field

from rollout import events
from rollout.context import RolloutContext, message_text
from rollout.errors import ModelError, NaturalCompletion, TimeLimitExceeded
from rollout.protocols import Environment, HasRuntime, Model
from rollout.records import Action, Task
from rollout.termination import Limits
from rollout.wire.gateway_calls import calls_to_steps

_TAIL = 1000
"""Characters of a failed command's output kept in the trajectory's exit message."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ExternalAgentConfig(Limits):
    type: str = "external"
    command: str = Field(min_length=1)
    """The agent's shell command, run once in the rollout's runtime (e.g. a CLI coding agent)."""
    gateway_url: str = Field(min_length=1)
    """The gateway's base URL as seen from inside the runtime (a container: the docker bridge's gateway IP)."""
    host_gateway_url: str | None = None
    """The gateway's base URL as seen from this process, to fetch the calls; none: ``gateway_url``."""
    api_key: str = "rollout-gateway"
    """``OPENAI_API_KEY`` in the command's environment (the gateway accepts any)."""
    timeout: float = Field(1800.0, gt=0)
    """Seconds the command may run; past it the rollout ends with ``time_limit``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the command."""
    submission: Literal["none", "output", "reply"] = "none"
    """What the outcome submits: nothing (a grader reads the environment, e.g. the repository's diff), the
    command's output, or the text of the last model reply."""
    gateway_timeout: float = Field(60.0, gt=0)
    """Seconds each request to the gateway (forget, fetch the calls) may take."""


class ExternalAgent:
    def __init__(self, config: ExternalAgentConfig | Mapping[str, Any]):
        self.config = config if isinstance(config, ExternalAgentConfig) else ExternalAgentConfig(**config)

    def limits(self) -> Limits:
        return Limits.of(self.config)

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        cfg = self.config
        rollout_id = ctx.meta.rollout_id or f"{task.task_id}-{uuid.uuid4().hex[:12]}"
        path = "/rollouts/" + quote(rollout_id, safe="")
        here = (cfg.host_gateway_url or cfg.gateway_url).rstrip("/") + path
        prompt = task.prompt or next((message_text(m) for m in reversed(task.messages or [])
                                      if m.get("role") == "user"), "")
        variables = {**cfg.env, "OPENAI_BASE_URL": cfg.gateway_url.rstrip("/") + path + "/v1",
                     "OPENAI_API_KEY": cfg.api_key, "ROLLOUT_ID": rollout_id, "ROLLOUT_TASK_ID": task.task_id,
                     "ROLLOUT_PROMPT": prompt}
        async with aiohttp.ClientSession() as session:
            await self._gateway(session, "DELETE", here)  # an earlier attempt's calls are not this one's
            reset = await ctx.reset_env(env, task)
            ctx.emitter.emit(events.ACTION_STARTED, step=1, command=cfg.command)
            code, timed_out, output = await _execute(env, cfg.command, variables, cfg.timeout,
                                                     reset.info.get("cwd"), prompt)
            data = await self._gateway(session, "GET", here + "/calls")
            await self._gateway(session, "DELETE", here)
        recorded = calls_to_steps(data.get("calls") or [])
        ctx.trajectory.tools = recorded.tools
        ctx.add_messages(*recorded.messages)
        for step in recorded.steps:
            ctx.trajectory.steps.append(step)
            ctx.step_done(step)
        if timed_out:
            raise TimeLimitExceeded(f"the agent's command timed out after {cfg.timeout:g}s")
        last = recorded.messages[-1] if recorded.messages else None  # the reply of the latest call
        submission = {"none": None, "output": output, "reply": message_text(last) if last else None}[cfg.submission]
        dropped = f" (the gateway dropped the {data['dropped']} oldest calls)" if data.get("dropped") else ""
        why = f"the agent's command exited with {code}{dropped}"
        raise NaturalCompletion(why + (f": {output[-_TAIL:]}" if code else ""), submission=submission)

    async def _gateway(self, session: aiohttp.ClientSession, method: str, url: str) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.config.gateway_timeout)
        try:
            async with session.request(method, url, timeout=timeout) as resp:
                body = await resp.read()
                if resp.status != 200:
                    text = body.decode("utf-8", "replace")[:300]
                    raise ModelError(f"model gateway: {method} {url}: HTTP {resp.status}: {text}")
                return json.loads(body)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise ModelError(f"model gateway cannot be reached: {method} {url}: {type(exc).__name__}: {exc}") from exc


async def _execute(env: Environment, command: str, variables: dict[str, str], timeout: float, cwd: str | None,
                   prompt: str) -> tuple[int, bool, str]:
    """(exit code, timed out, output) of ``command`` in the environment's runtime."""
    if isinstance(env, HasRuntime):
        merged = {**env.runtime_env, **variables}
        result = await env.runtime.exec(command, timeout=timeout, cwd=cwd, env=merged, stdin=prompt.encode())
        return result.returncode, result.timed_out, result.output
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items() if _ENV_NAME.match(k))
    action = Action(kind="bash", name="bash", arguments={"command": f"export {exports}; {command}"})
    obs = (await env.step([action]))[0]
    return int(obs.info.get("returncode", 0 if obs.success else 1)), bool(obs.info.get("timed_out")), obs.content
