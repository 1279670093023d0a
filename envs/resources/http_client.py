"""One rollout's HTTP client of a resources server: POSTs with the rollout's own cookie jar (cookies the server
sets travel with the rollout's later calls, never to another rollout), failures as infrastructure errors, and the
``/verify`` call both resources environments make."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Mapping

import aiohttp
from yarl import URL

from rollout.errors import EnvironmentFailure, VerifierError


class ResourcesHttp:
    def __init__(self, url: str, timeout: float, cookies: Mapping[str, str] | None = None):
        self.url, self.timeout = url.rstrip("/"), timeout
        self.cookies = {str(k): str(v) for k, v in (cookies or {}).items()}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # unsafe: the server may be on an IP address (127.0.0.1)
            jar = aiohttp.CookieJar(unsafe=True)
            if self.cookies:
                jar.update_cookies(self.cookies, URL(self.url))
            self._session = aiohttp.ClientSession(cookie_jar=jar)
        return self._session

    def current_cookies(self) -> dict[str, str]:
        """The cookies the rollout holds now (the caller's, and what the server set since)."""
        if self._session is None:
            return dict(self.cookies)
        return {c.key: c.value for c in self._session.cookie_jar}

    async def call(self, path: str, body: Any, timeout: float | None = None) -> tuple[int, str]:
        """(status, text) of one POST; an unreachable server or a timeout is an ``EnvironmentFailure``."""
        seconds = timeout or self.timeout
        try:
            async with self._client().post(f"{self.url}/{path}", json=body,
                                           timeout=aiohttp.ClientTimeout(total=seconds)) as resp:
                return resp.status, await resp.text(errors="replace")
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise EnvironmentFailure(f"resources server {self.url}/{path}: no answer in {seconds:g}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise EnvironmentFailure(f"resources server {self.url}/{path} unreachable: "
                                     f"{type(exc).__name__}: {exc}") from exc

    async def verify(self, body: Any) -> dict[str, Any]:
        """``POST /verify``: the verify response, whose ``reward`` is a finite number; anything else (no answer, an
        error status, no numeric reward) is a ``VerifierError`` — never a reward of 0."""
        try:
            status, text = await self.call("verify", body)
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
        verdict["reward"] = reward
        return verdict

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
