"""A small HTTP/1.1 client for plain ``http://`` model servers: POST a body, read one response, keep the
connection for the next request.

aiohttp is most of what a rollout costs the farm per step (about 40% of a worker's CPU at thousands of
rollouts in flight: request objects, header multidicts, the connector's bookkeeping, a stream reader per
response). Talking to an OpenAI-compatible server takes far less: one request line and a few headers out,
a status line, ``Content-Length`` or chunked body back. This does that on an ``asyncio.Protocol`` per
connection, with an idle pool per address (newest first), and nothing else: no TLS, proxies, redirects,
cookies or compression (``OpenAIModel`` uses aiohttp for those URLs). Responses are parsed by llhttp (through
``httptools``, as aiohttp and uvicorn do): a malformed status line, chunk size or ``Content-Length`` is an
error, never data.

When a POST is resent (the whole rule): at most once per ``post()``, over a new connection, and only when the
request went out on a *reused* idle connection that ended without a single byte of response — found closed
when the request was written, or closed or reset by the server before it answered anything. That is how a
server's keep-alive timeout racing our request looks. The server may have read the request even so (nobody
can tell from outside), hence at most once. Never resent: a request on a new connection, a timeout, a
response that started and was cut. Those are a ``ConnectionFailed`` or ``asyncio.TimeoutError`` for the
caller, whose own retries are bounded and backed off (``OpenAIModel``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import httptools

from rollout.waits import within

Response = tuple[int, dict[str, str], bytes]


class ConnectionFailed(ConnectionError):
    """The connection failed or the server broke the protocol; the request may be retried."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time. The parser calls the ``on_*`` methods."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.answered = False
        """Any byte of a response to the current request arrived (then it is never resent)."""
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._head_done = False

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: the stream is out of step
            return
        self.answered = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self.close()
            if not waiter.done():
                waiter.set_exception(ConnectionFailed(f"malformed HTTP response: {exc or type(exc).__name__}"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost finishes or fails the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._head_done and self._ends_with_connection():
            waiter.set_result((self._status, self._headers, b"".join(self._body)))
            return
        reason = f": {exc}" if exc else ""
        if self.answered:
            got = sum(map(len, self._body))
            message = f"the server closed the connection before the response ended ({got} body bytes){reason}"
        else:
            message = f"the server closed the connection without answering{reason}"
        waiter.set_exception(ConnectionFailed(message))

    # ---- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim response: the real one follows
            self._headers = {}
            return
        self._status, self._head_done = status, True
        if not self._parser.should_keep_alive():
            self.reusable = False

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if not self._head_done:
            return  # the end of an interim response
        if waiter is None or waiter.done():
            self.close()  # a second response to one request
            return
        waiter.set_result((self._status, self._headers, b"".join(self._body)))

    def _ends_with_connection(self) -> bool:
        """The response has no length of its own: its body is whatever came before a clean close."""
        headers = self._headers
        return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()

    # ---- requests ------------------------------------------------------------------------------

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.close()

    async def request(self, data: bytes, timeout: float) -> Response:
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise ConnectionFailed("the connection closed before the request was written")
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._status, self._headers, self._body, self._head_done, self.answered = 0, {}, [], False, False
        self.transport.write(data)
        timer = loop.call_later(timeout, self._time_out, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _time_out(self, waiter: asyncio.Future) -> None:
        if not waiter.done():
            waiter.set_exception(asyncio.TimeoutError())
            self.close()


def _clean(value: str) -> str:
    """A header value with line breaks removed: a task id cannot smuggle headers into a request."""
    return value.replace("\r", " ").replace("\n", " ")


class Http1Pool:
    """``post`` to one ``http://`` URL over pooled keep-alive connections (belongs to one event loop)."""

    def __init__(self, url: str, headers: dict[str, str], keepalive: float = 60.0, connect_timeout: float = 30.0):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Http1Pool speaks plain http:// only, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = self.host if parts.port is None else f"{self.host}:{self.port}"
        if ":" in self.host and not self.host.startswith("["):
            host_header = f"[{self.host}]" + ("" if parts.port is None else f":{self.port}")
        fixed = {"Host": host_header, "Connection": "keep-alive", "Accept": "application/json", **headers}
        self._head = (f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {_clean(v)}\r\n" for k, v in fixed.items())).encode()
        self.keepalive, self.connect_timeout = keepalive, connect_timeout
        self._idle: list[tuple[_Connection, float]] = []
        self.opened = 0
        """Connections opened so far (a pool that keeps opening them is losing them)."""

    async def post(self, body: bytes, headers: dict[str, str] | None = None, timeout: float = 600.0) -> Response:
        """(status, lower-cased headers, body) of one POST; ``headers`` are added to the fixed ones."""
        extra = "".join(f"{k}: {_clean(v)}\r\n" for k, v in headers.items()) if headers else ""
        data = self._head + f"{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body
        conn = self._take()
        may_resend = conn is not None  # only a reused connection can have gone stale unseen
        if conn is None:
            conn = await self._connect()
        while True:
            try:
                response = await conn.request(data, timeout)
            except ConnectionFailed:
                conn.close()
                if not may_resend or conn.answered:
                    raise
                may_resend = False  # once, and over a new connection: the other idle ones may be as stale
                conn = await self._connect()
                continue
            except BaseException:
                conn.close()
                raise
            if conn.reusable and not conn.closed:
                self._idle.append((conn, time.monotonic()))
            else:
                conn.close()
            return response

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn, since = self._idle.pop()  # the newest: the least likely to have been dropped
            if not conn.closed and now - since <= self.keepalive:
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await within(loop.create_connection(_Connection, self.host, self.port), self.connect_timeout)
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self.opened += 1
        return conn

    def close(self) -> None:
        for conn, _ in self._idle:
            conn.close()
        self._idle.clear()

    def __getstate__(self) -> Any:  # connections belong to one process and loop
        raise TypeError("Http1Pool does not pickle; make one per event loop")
