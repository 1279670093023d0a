"""ExternalAgent: an outside agent that only speaks OpenAI (a CLI coding agent), farmed through the model gateway.

Its ``command`` runs once in the rollout's runtime with ``OPENAI_BASE_URL`` (and ``OPENAI_API_BASE``, litellm's
name) set to the rollout's base URL on the gateway, ``OPENAI_API_KEY`` set (also ``ROLLOUT_ID``, ``ROLLOUT_TASK_ID``
and ``ROLLOUT_PROMPT``, the task's request, which is on its standard input too).

Which gateway: without a ``gateway_url`` the farm opens one for the run (``rollout.protocols.ModelGateway``, bound
by the composition: ``cluster.gateway.sandbox``). Each rollout then gets a key of its own as
``OPENAI_API_KEY``, and its base URL is ``http://127.0.0.1:<port>/rollouts/<rollout id>/v1`` on the sandbox's own
loopback, where a forwarder (``agents.sandbox_forwarder``, run by the image's ``python3``) passes the bytes to the
gateway's unix socket bound into the sandbox: the sandbox keeps no network. With a ``gateway_url`` (a gateway
someone else started, ``cluster.gym.gateway``) the URL is ``<gateway_url>/rollouts/<rollout id>/v1`` and the
sandbox needs a network that reaches it. It runs in the environment's runtime when the environment declares one
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
import functools
import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any, Literal, Mapping
from urllib.parse import quote

import aiohttp
from pydantic import Field

from agents import sandbox_forwarder
from rollout import events
from rollout.context import RolloutContext, message_text
from rollout.errors import ModelError, NaturalCompletion, RuntimeFailure, TimeLimitExceeded
from rollout.protocols import Environment, GatewayLease, HasRuntime, Model, ModelGateway
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
    gateway_url: str | None = Field(None, min_length=1)
    """A gateway of one's own: its base URL as seen from inside the runtime (a container on a network that reaches
    it). None: the run opens one (a key per rollout, the sandbox without network)."""
    host_gateway_url: str | None = None
    """The gateway's base URL as seen from this process, to fetch the calls; none: ``gateway_url``."""
    api_key: str = "rollout-gateway"
    """``OPENAI_API_KEY`` in the command's environment with a ``gateway_url`` (the run's gateway gives each rollout
    a key of its own instead)."""
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
    def __init__(self, config: ExternalAgentConfig | Mapping[str, Any], gateway: ModelGateway | None = None):
        self.config = config if isinstance(config, ExternalAgentConfig) else ExternalAgentConfig(**config)
        self.gateway = gateway

    def limits(self) -> Limits:
        return Limits.of(self.config)

    def needs_gateway(self) -> bool:
        return self.config.gateway_url is None

    def bind_gateway(self, gateway: ModelGateway) -> None:
        self.gateway = gateway

    async def run(self, task: Task, model: Model, env: Environment, ctx: RolloutContext) -> None:
        cfg = self.config
        rollout_id = ctx.meta.rollout_id or f"{task.task_id}-{uuid.uuid4().hex[:12]}"
        prompt = task.prompt or next((message_text(m) for m in reversed(task.messages or [])
                                      if m.get("role") == "user"), "")
        variables = {**cfg.env, "ROLLOUT_ID": rollout_id, "ROLLOUT_TASK_ID": task.task_id, "ROLLOUT_PROMPT": prompt}
        if cfg.gateway_url is not None:
            code, timed_out, output, data = await self._through_url(cfg.gateway_url, rollout_id, variables, task,
                                                                    env, ctx, prompt)
        elif self.gateway is not None:
            code, timed_out, output, data = await self._through_lease(self.gateway, rollout_id, variables, task,
                                                                      env, ctx, prompt)
        else:
            raise ModelError("the external agent has no gateway: name agent.gateway_url, or run it through the "
                             "farm, which opens one", retryable=False)
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

    async def _through_url(self, gateway_url: str, rollout_id: str, variables: dict[str, str], task: Task,
                           env: Environment, ctx: RolloutContext, prompt: str) -> tuple[int, bool, str, dict]:
        """The command against a gateway someone else started, its calls fetched over HTTP."""
        cfg = self.config
        path = "/rollouts/" + quote(rollout_id, safe="")
        here = (cfg.host_gateway_url or gateway_url).rstrip("/") + path
        base = gateway_url.rstrip("/") + path + "/v1"
        variables = {**variables, "OPENAI_BASE_URL": base, "OPENAI_API_BASE": base, "OPENAI_API_KEY": cfg.api_key}
        async with aiohttp.ClientSession() as session:
            await self._gateway(session, "DELETE", here)  # an earlier attempt's calls are not this one's
            reset = await ctx.reset_env(env, task)
            ctx.emitter.emit(events.ACTION_STARTED, step=1, command=cfg.command)
            code, timed_out, output = await _execute(env, cfg.command, variables, cfg.timeout,
                                                     reset.info.get("cwd"), prompt)
            data = await self._gateway(session, "GET", here + "/calls")
            await self._gateway(session, "DELETE", here)
        return code, timed_out, output, data

    async def _through_lease(self, gateway: ModelGateway, rollout_id: str, variables: dict[str, str], task: Task,
                             env: Environment, ctx: RolloutContext, prompt: str) -> tuple[int, bool, str, dict]:
        """The command behind a forwarder to the farm's gateway, with the rollout's own key."""
        cfg = self.config
        meta = ctx.meta.model_copy(update={"rollout_id": rollout_id, "task_id": ctx.meta.task_id or task.task_id})
        lease = await gateway.open(meta)
        try:
            reset = await ctx.reset_env(env, task)
            ctx.emitter.emit(events.ACTION_STARTED, step=1, command=cfg.command)
            code, timed_out, output = await _execute(env, behind_forwarder(cfg.command), {**variables,
                                                     **lease_variables(lease)}, cfg.timeout, reset.info.get("cwd"),
                                                     prompt)
            if code == FORWARDER_FAILED and FORWARDER_MARK in output:
                raise RuntimeFailure(f"the model gateway's forwarder did not start in the sandbox: {output[-_TAIL:]}")
            data = await gateway.calls(rollout_id)
        finally:
            await gateway.close(rollout_id)
        return code, timed_out, output, data

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


FORWARDER_FAILED = 97
"""The wrapper's exit code when the forwarder never listened (no ``python3`` in the image, no socket)."""
FORWARDER_MARK = "rollout-farm: the model gateway's forwarder"


def lease_variables(lease: GatewayLease) -> dict[str, str]:
    """What the wrapper (``behind_forwarder``) reads: the socket, the URL path, the key, the forwarder's source."""
    return {"ROLLOUT_GATEWAY_SOCKET": lease.socket, "ROLLOUT_GATEWAY_PATH": lease.path,
            "OPENAI_API_KEY": lease.api_key, "ROLLOUT_GATEWAY_FORWARDER": _forwarder_source()}


def behind_forwarder(command: str) -> str:
    """``command`` in bash, after the forwarder listens on the sandbox's loopback and ``OPENAI_BASE_URL`` points at
    it; the forwarder stopped after it, the command's exit code kept."""
    return "\n".join([
        '__rf_port="$(mktemp)"; rm -f "$__rf_port"',
        'python3 -c "$ROLLOUT_GATEWAY_FORWARDER" "$ROLLOUT_GATEWAY_SOCKET" "$__rf_port" </dev/null & __rf_fwd=$!',
        'for __rf_i in $(seq 1 400); do [ -s "$__rf_port" ] && break; kill -0 $__rf_fwd 2>/dev/null || break; '
        'sleep 0.05; done',
        f'if [ ! -s "$__rf_port" ]; then echo "{FORWARDER_MARK} did not listen (python3 in the image? the socket '
        f'$ROLLOUT_GATEWAY_SOCKET bound?)" >&2; exit {FORWARDER_FAILED}; fi',
        'OPENAI_BASE_URL="http://127.0.0.1:$(cat "$__rf_port")$ROLLOUT_GATEWAY_PATH"; rm -f "$__rf_port"',
        'export OPENAI_BASE_URL OPENAI_API_BASE="$OPENAI_BASE_URL"; unset ROLLOUT_GATEWAY_FORWARDER',
        "(",
        command,
        ")",
        "__rf_code=$?; kill $__rf_fwd 2>/dev/null; exit $__rf_code",
    ])


@functools.cache
def _forwarder_source() -> str:
    return Path(sandbox_forwarder.__file__).read_text(encoding="utf-8")


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
