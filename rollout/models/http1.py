"""A small HTTP/1.1 client for plain ``http://`` model servers: POST a body, read one response, keep the
connection for the next request.

aiohttp is most of what a rollout costs the farm per step (about 40% of a worker's CPU at thousands of
rollouts in flight: request objects, header multidicts, the connector's bookkeeping, a stream reader per
response). Talking to an OpenAI-compatible server takes far less: one request line and a few headers out,
a status line, ``Content-Length`` or chunked body back. This does that on an ``asyncio.Protocol`` per
connection, with an idle pool per address (newest first), and nothing else: no TLS, proxies, redirects,
cookies or compression (``OpenAIModel`` uses aiohttp for those URLs). A pooled connection that the server
closed while idle is replaced transparently; every other failure is a ``ConnectionFailed`` (retried by the
caller) or ``asyncio.TimeoutError``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
"""Bytes a response's status line and headers may take."""


class ConnectionFailed(ConnectionError):
    """The connection failed or the server broke the protocol; the request may be retried."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._waiter: asyncio.Future | None = None
        self._buf = bytearray()
        self._head: tuple[int, dict[str, str]] | None = None
        self._body_start = 0
        self._length: int | None = None
        self._chunked = False
        self._until_close = False
        self.got_bytes = False

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.reusable = False  # bytes nobody asked for: the stream is out of step
            self.close()
            return
        self.got_bytes = True
        self._buf += data
        try:
            done = self._parse()
        except (ValueError, IndexError) as exc:
            self.reusable = False
            self._waiter.set_exception(ConnectionFailed(f"malformed HTTP response: {exc}"))
            self.close()
            return
        if done is not None:
            self._waiter.set_result(done)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost finishes or fails the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._until_close and self._head is not None:
                status, headers = self._head
                waiter.set_result((status, headers, bytes(self._buf[self._body_start:])))
            else:
                reason = f": {exc}" if exc else ""
                waiter.set_exception(ConnectionFailed(f"the server closed the connection{reason}"))

    # ---- requests ------------------------------------------------------------------------------

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.close()

    async def request(self, data: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._buf.clear()
        self._head, self._length, self._chunked, self._until_close = None, None, False, False
        self.got_bytes = False
        assert self.transport is not None
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

    def _parse(self) -> tuple[int, dict[str, str], bytes] | None:
        buf = self._buf
        while self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise ValueError("headers too long")
                return None
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            version, status_text = lines[0].split(" ", 2)[:2]
            status = int(status_text)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if 100 <= status < 200:  # an interim response: the real one follows
                del buf[:end + 4]
                continue
            self._head, self._body_start = (status, headers), end + 4
            connection = headers.get("connection", "").lower()
            if connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive"):
                self.reusable = False
            if status in (204, 304):
                self._length = 0
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                self._chunked = True
            elif "content-length" in headers:
                self._length = int(headers["content-length"])
            else:
                self._until_close, self.reusable = True, False
        status, headers = self._head
        if self._length is not None:
            if len(buf) - self._body_start < self._length:
                return None
            return status, headers, bytes(buf[self._body_start:self._body_start + self._length])
        if self._chunked:
            body = _dechunk(buf, self._body_start)
            return None if body is None else (status, headers, body)
        return None  # until the server closes


def _clean(value: str) -> str:
    """A header value with line breaks removed: a task id cannot smuggle headers into a request."""
    return value.replace("\r", " ").replace("\n", " ")


def _dechunk(buf: bytearray, pos: int) -> bytes | None:
    """The body of a complete chunked message starting at ``pos``, or None while it is incomplete."""
    parts = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            trailer_end = buf.find(b"\r\n\r\n", eol) if buf[eol:eol + 4] != b"\r\n\r\n" else eol
            return b"".join(parts) if trailer_end >= 0 else None
        start = eol + 2
        if len(buf) < start + size + 2:
            return None
        parts.append(bytes(buf[start:start + size]))
        pos = start + size + 2


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

    async def post(self, body: bytes, headers: dict[str, str] | None = None,
                   timeout: float = 600.0) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased headers, body) of one POST; ``headers`` are added to the fixed ones."""
        extra = "".join(f"{k}: {_clean(v)}\r\n" for k, v in headers.items()) if headers else ""
        data = self._head + f"{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body
        while True:
            conn, reused = self._take(), True
            if conn is None:
                conn, reused = await self._connect(), False
            try:
                status, response_headers, raw = await conn.request(data, timeout)
            except ConnectionFailed:
                conn.close()
                if reused and not conn.got_bytes:  # the server dropped an idle connection: use another
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if conn.reusable and not conn.closed:
                self._idle.append((conn, time.monotonic()))
            else:
                conn.close()
            return status, response_headers, raw

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
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, self.host, self.port),
                                             self.connect_timeout)
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
