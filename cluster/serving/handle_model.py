"""``HandleModel``: the OpenAI client whose chat completions reach the run's own Serve application through a
``DeploymentHandle`` instead of Serve's HTTP proxy (a farm worker is a Ray process: the proxy's HTTP parse, its
ASGI hop and the replica's Starlette request are the larger part of a call's cost; ``tests/perf/bench_serve.py``
(a) measures both paths).

Everything but the transport is ``OpenAIModel``'s: the request body, retries, statuses, token data and usage of
the reply. The replica's ``post`` method answers the scripted server's routes with (status, headers, body); the
rollout id is the handle's ``session_id``, so the deployment's sticky router keeps a rollout's turns on one replica
and frees it when the rollout ends (the release goes through the same handle: the router lives in this process).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from rollout.models.client.config import OpenAIModelConfig
from rollout.models.client.http1 import Response
from rollout.models.client.model import OpenAIModel
from rollout.records import RequestMeta
from rollout.waits import within
from rollout.wire.chat import RELEASE_PREFIX, error_body

CHAT_PATH = "/v1/chat/completions"
RELEASE_PATH = "/v1/sessions/release"


class _AtLeast(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def quiet_serve_logs(level: str) -> None:
    """Serve's own logger in this process at ``level`` (a filter too: Serve sets its logger's level itself when its
    router starts)."""
    logger = logging.getLogger("ray.serve")
    number = logging.getLevelName(level.upper())
    number = number if isinstance(number, int) else logging.WARNING
    logger.setLevel(number)
    for old in [f for f in logger.filters if isinstance(f, _AtLeast)]:
        logger.removeFilter(old)
    logger.addFilter(_AtLeast(number))


class HandleModel(OpenAIModel):
    """``OpenAIModel`` with its chat completions sent through a ``DeploymentHandle`` of ``deployment`` in
    application ``app`` (the method ``method`` of its replicas). Safe to share across the rollouts of a process;
    a pickled copy makes its own handle."""

    def __init__(self, config: OpenAIModelConfig, app: str, deployment: str, method: str = "post",
                 log_level: str = "WARNING"):
        super().__init__(config)
        self.app, self.deployment, self.method = app, deployment, method
        self.log_level = log_level
        """Of Serve's own logger in this process (``serve.log_level``): its router's INFO lines (long-poll client
        started, router initialised, ring rebuilt) would otherwise reach the run's terminal from every worker."""
        self._handle: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_handle": None}

    def handle(self, session: str = "") -> Any:
        """The deployment's handle (made on first use), for the session ``session`` when given."""
        if self._handle is None:
            from ray import serve

            quiet_serve_logs(self.log_level)
            self._handle = serve.get_deployment_handle(self.deployment, self.app).options(method_name=self.method)
        return self._handle.options(session_id=session) if session else self._handle

    async def _state(self) -> Any:
        state = await super()._state()
        if not isinstance(state.lean, HandleTransport):
            if state.lean is not None:
                state.lean.close()
            state.lean = HandleTransport(self)  # ``_post`` sends chat completions through it
        return state

    async def end_session(self, meta: RequestMeta) -> None:
        """Tell this process's router the rollout ended (best effort, never raises)."""
        if self._streams is not None:
            self._streams.forget(meta.rollout_id)
        if not self.config.release_sessions or not meta.rollout_id:
            return
        try:
            await within(self.handle(RELEASE_PREFIX + meta.rollout_id).remote(RELEASE_PATH, b"{}", ""), 10.0)
        except Exception:  # noqa: BLE001 - the router forgets the session after its TTL anyway
            pass


class HandleTransport:
    """What ``OpenAIModel._post`` takes for its lean HTTP pool: ``post(body, headers, timeout)`` giving
    (status, lower-case headers, body). A call that got no answer (its replica died, no replica, Serve gone) is the
    HTTP 500 Serve's proxy answers then, retried by the model like any 5xx; a call past ``timeout`` is cancelled
    and raises ``asyncio.TimeoutError`` as the HTTP client's does."""

    def __init__(self, model: HandleModel):
        self.model = model

    async def post(self, body: bytes, headers: dict[str, str] | None = None, timeout: float = 600.0) -> Response:
        rollout_id, response = (headers or {}).get("X-Rollout-Id", ""), None
        try:
            response = self.model.handle(rollout_id).remote(CHAT_PATH, body, rollout_id)
            status, got, raw = await within(response, timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):  # the rollout ended or the call took too long
            if response is not None:
                response.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - Ray's and Serve's errors: the call got no answer
            # as Serve's proxy answers a call whose replica failed: a 500, which the model retries
            message = f"the Serve call failed: {type(exc).__name__}: {str(exc).strip()[:500]}"
            return 500, {}, json.dumps(error_body(message, 500)).encode()
        return status, {name.lower(): value for name, value in got.items()}, raw

    def close(self) -> None:
        """Nothing to close: the handle is the process's."""
