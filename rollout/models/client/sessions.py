"""The OpenAI client's HTTP sessions, one per event loop (aiohttp sessions belong to the loop they start on):
made on first use, closed by ``aclose`` or when their loop ends, never pickled (a Ray worker's copy makes its
own). ``OpenAIModel`` (``model``) mixes this in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp

from rollout.models.client.http1 import Http1Pool
from rollout.wire.chat import raise_open_file_limit


@dataclass
class LoopState:
    """What belongs to one event loop: the session, the in-flight bound, the session's closer."""

    session: aiohttp.ClientSession
    semaphore: asyncio.Semaphore
    closer: AsyncIterator[None]
    timeout: aiohttp.ClientTimeout
    lean: Http1Pool | None = None


class LoopSessions:
    """Needs ``config`` (an ``OpenAIModelConfig``), ``url``, ``_headers`` and ``_loops`` (a dict) on the object."""

    config: Any
    url: str
    _headers: dict[str, str]
    _loops: dict[Any, LoopState]

    async def _state(self) -> LoopState:
        """This loop's session, made on first use: aiohttp sessions belong to the loop they start on."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            for old in [lp for lp in self._loops if lp.is_closed()]:
                del self._loops[old]
            raise_open_file_limit()
            connector = aiohttp.TCPConnector(limit=self.config.max_connections, limit_per_host=0, ttl_dns_cache=300,
                                            keepalive_timeout=self.config.keepalive_timeout)
            # No response decompression or default headers to compute: less work per request at 10k in flight.
            session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                            skip_auto_headers=("User-Agent",))
            lean = None
            if (self.config.http_client == "auto" and self.url.startswith("http://")
                    and not self.config.max_connections):
                lean = Http1Pool(self.url, self._headers, keepalive=self.config.keepalive_timeout)
            state = LoopState(session, asyncio.Semaphore(self.config.max_concurrency),
                               _close_at_loop_end(session, lean), aiohttp.ClientTimeout(total=self.config.timeout),
                               lean)
            self._loops[loop] = state
            # Started and parked at its yield: asyncio.run() finalises such generators while the
            # loop still runs, which closes the session even when nobody calls aclose().
            await state.closer.__anext__()
        return state

    def __getstate__(self) -> dict[str, Any]:  # a pickled copy (a Ray worker) makes its own sessions and streams
        return {**self.__dict__, "_loops": {}, "_streams": None}

    async def aclose(self) -> None:
        """Close this event loop's session (other loops' sessions close when their loop ends)."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            if state.lean is not None:
                state.lean.close()
            await state.session.close()
            await state.closer.aclose()


async def _close_at_loop_end(session: aiohttp.ClientSession, lean: Http1Pool | None) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if lean is not None:
            lean.close()
        if not session.closed:
            await session.close()
