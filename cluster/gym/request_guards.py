"""The agent server's guards around a request: a body limit counted while the body arrives (``BodyLimit``), and an
episode that ends when its client leaves (``while_connected``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

Receive = Callable[[], Awaitable[dict[str, Any]]]


class BodyTooLarge(Exception):
    """Raised from ``receive`` once a body passes the limit (not a ValueError: no route may take it for bad JSON)."""


class ClientGone(Exception):
    """The client disconnected before its episode ended; the episode was cancelled."""


class BodyLimit:
    """ASGI middleware: a request whose body is over ``limit`` bytes is answered 413, as soon as its
    ``content-length`` says so or, without one (chunked), as soon as the bytes received pass it; what arrived is
    dropped, so a large body costs the server at most ``limit`` bytes, never its whole size."""

    def __init__(self, app: Any, limit: int | None):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Any) -> None:
        if scope["type"] != "http" or self.limit is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        received, started = 0, False

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge()
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"error": {"type": "request_too_large", "message": (
            f"the request body is over this server's limit of {self.limit} bytes (gym.max_body_bytes)")}}).encode()
        # ``connection: close``: the rest of the body is never read, so this connection cannot carry another request
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (once the body is read, the server's next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(receive: Receive, work: Awaitable[Any]) -> Any:
    """``work``'s result; ``ClientGone`` as soon as the client disconnects first. Either way, or when the handler
    itself is cancelled (Serve's proxy cancels a request whose client left), unfinished work is cancelled: the
    farm then cancels the episode and removes its containers."""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        left = not job.done()
        if left:
            job.cancel()
            job.add_done_callback(lambda f: f.cancelled() or f.exception())  # its error is moot now
    if left:
        raise ClientGone()
    return job.result()
