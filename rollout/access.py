"""Who may call a service the farm listens with: on a loopback address anyone on this machine; on any other, only a
caller with the service's bearer token (given in its config, else generated at start and printed once), compared in
constant time. ``AccessGuard`` is the same rule as ASGI middleware (a 401 that says how to pass the token).

Pure Python: the live page, the agent server, the scripted server and the Serve model's face all use these."""

from __future__ import annotations

import hmac
import json
import secrets
from typing import Any, Awaitable, Callable, Iterable, Protocol

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Addresses only this machine reaches: a service bound to one of them needs no token."""
TOKEN_HEADER = "X-Rollout-Token"
"""A second header that carries the token (``Authorization: Bearer`` is the first)."""
HOW_TO_PASS = f"send `Authorization: Bearer <token>` (or `{TOKEN_HEADER}: <token>`)"


def is_loopback(host: str | None) -> bool:
    """Only this machine reaches ``host`` (127.0.0.0/8, localhost, ::1)."""
    host = (host or "").strip("[]")
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def token_for(host: str | None, token: str | None) -> str | None:
    """The token a service on ``host`` requires: ``token`` when given, a fresh one when ``host`` is not loopback,
    else None (no token asked for)."""
    if token:
        return token
    return None if is_loopback(host) else new_token()


def checked_token(value: str | None) -> str | None:
    """A config field's token without surrounding whitespace (a token file's newline; None stays None);
    ``ValueError`` for an empty or blank one, which would guard nothing (a pydantic field validator's body: the error
    names the field, and what it quotes is blank)."""
    if value is not None and not value.strip():
        raise ValueError("a token must not be empty or blank (leave it unset to have one generated at start)")
    return value.strip() if value is not None else None


def presented(header: Callable[[str], str | None], query_token: str | None = None) -> str:
    """The token a request carries: ``?token=`` (``query_token``), ``X-Rollout-Token`` or ``Authorization:
    Bearer`` (``header``: the request's header lookup, any spelling of the name)."""
    given = query_token or header(TOKEN_HEADER) or ""
    if not given:
        bearer = header("Authorization") or ""
        if bearer[:7].lower() == "bearer ":
            given = bearer[7:].strip()
    return given


class Keys(Protocol):
    """More than one token a service takes (a kept model application takes the key of each run that reuses it)."""

    def accepts(self, given: str) -> bool:
        """Whether ``given`` is one of them (compared in constant time)."""
        ...


def allowed(given: str, token: str | Keys | None) -> bool:
    """Whether a request that presented ``given`` may pass (no token required: always), in constant time."""
    if token is None:
        return True
    if isinstance(token, str):
        return hmac.compare_digest(given.encode(), token.encode())
    return token.accepts(given)


def refusal(service: str) -> str:
    """The 401's message (never the token)."""
    return f"{service} needs its token: {HOW_TO_PASS}; it was printed when the service started, or is in its config"


def listening_line(service: str, url: str, token: str | None, *, generated: bool, field: str) -> str:
    """The one line said at start: where ``service`` listens and whether (and how) it needs a token; a generated
    token is shown here, once, and a configured one is named by its ``field``."""
    if token is None:
        return f"{service} listens at {url} (loopback: no token)"
    shown = f"token {token} (generated; set {field} to choose one)" if generated else f"the token of {field}"
    return f"{service} listens at {url}; every request needs {shown}: {HOW_TO_PASS}"


class AccessGuard:
    """ASGI middleware: with a ``token``, an HTTP request that does not present it is answered 401 (JSON, OpenAI's
    error shape) before the app sees it; paths in ``open_paths`` pass (a health route that reveals nothing)."""

    def __init__(self, app: Any, token: str | Keys | None, service: str = "this server",
                 open_paths: Iterable[str] = ()):
        self.app, self.token, self.service, self.open_paths = app, token, service, frozenset(open_paths)

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
        if scope["type"] != "http" or self.token is None or _below_root(scope) in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        if allowed(presented(lambda name: headers.get(name.lower())), self.token):
            await self.app(scope, receive, send)
            return
        body = json.dumps(refusal_body(self.service)).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def _below_root(scope: dict[str, Any]) -> str:
    """A request's path below its application's prefix (Serve passes the whole path with ``root_path`` set)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def refusal_body(service: str) -> dict[str, Any]:
    """The 401's JSON body, in OpenAI's error shape."""
    return {"error": {"message": refusal(service), "type": "AuthenticationError", "code": "invalid_token",
                      "param": None}}
