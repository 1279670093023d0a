"""The built-in HTTP/1.1 client against real servers on 127.0.0.1: the fake OpenAI server, and raw asyncio
servers that answer the way other servers do (chunked, interim 100, Connection: close, dropped idle
connections, silence, garbage) or misbehave on purpose (hanging up on a POST, malformed framing, resets)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Awaitable, Callable

import pytest

from cluster.serving.scripted_server.server import ScriptedServerConfig, fake_server
from rollout.models.client.http1 import ConnectionFailed, Http1Pool
from rollout.models.client.model import OpenAIModel, OpenAIModelConfig

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Gets one request (head + body); writes a response; returns False to close the connection."""


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    return head + await reader.readexactly(length)


async def raw_server(handler: Handler) -> tuple[asyncio.AbstractServer, str, list[int]]:
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while (request := await read_request(reader)) is not None:
            keep = await handler(request, writer)
            await writer.drain()
            if not keep:
                break
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions", connections


def run(coro):
    return asyncio.run(coro)


def test_posts_to_the_fake_server_and_reuses_one_connection():
    async def main():
        async with fake_server(ScriptedServerConfig(policy="rollout.models.policies:bash_echo")) as server:
            pool = Http1Pool(server.url + "/chat/completions", {"Content-Type": "application/json"})
            body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}).encode()
            answers = [await pool.post(body, {"X-Rollout-Id": f"r{i}#0"}) for i in range(5)]
            pool.close()
            return answers, pool.opened

    answers, opened = run(main())
    assert [status for status, _, _ in answers] == [200] * 5
    assert all(json.loads(raw)["choices"][0]["message"]["content"] for _, _, raw in answers)
    assert answers[0][1]["content-type"].startswith("application/json")
    assert opened == 1, "sequential requests share one keep-alive connection"


def test_chunked_bodies_interim_responses_and_connection_close():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"chunked" in request:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n"
                         b"5;ext=1\r\nhello\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)  # the rest in another packet
            writer.write(b"6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
            return True
        writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy")
        return False

    async def main():
        server, url, connections = await raw_server(handler)
        pool = Http1Pool(url, {})
        chunked = await pool.post(b"chunked")
        again = await pool.post(b"chunked")  # same connection
        closing = await pool.post(b"plain")
        after = await pool.post(b"chunked")  # a new one: the server said close
        pool.close()
        server.close()
        return chunked, again, closing, after, len(connections)

    chunked, again, closing, after, connections = run(main())
    assert chunked[0] == 200 and chunked[2] == b"hello world" and chunked[1]["retry-after"] == "3"
    assert again[2] == b"hello world"
    assert closing == (503, {"content-length": "4", "connection": "close"}, b"busy")
    assert after[2] == b"hello world"
    assert connections == 2


def test_an_idle_connection_the_server_dropped_is_replaced_without_an_error():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return False  # closes after answering, without saying so (a short server keep-alive)

    async def main():
        server, url, connections = await raw_server(handler)
        pool = Http1Pool(url, {})
        answers = []
        for _ in range(3):
            answers.append(await pool.post(b"x"))
            await asyncio.sleep(0.05)  # the close reaches us while the connection idles
        pool.close()
        server.close()
        return answers, pool.opened

    answers, opened = run(main())
    assert [a[2] for a in answers] == [b"ok"] * 3
    assert opened == 3


def test_silence_times_out_and_garbage_is_a_connection_failure():
    async def silent(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    async def garbage(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SMTP ready\r\n\r\n")
        return False

    async def main():
        out = []
        for handler in (silent, garbage):
            server, url, _ = await raw_server(handler)
            pool = Http1Pool(url, {})
            try:
                await pool.post(b"x", timeout=0.3)
            except BaseException as exc:  # noqa: BLE001 - the test looks at which
                out.append(type(exc))
            pool.close()
            server.close()
        return out

    assert run(main()) == [asyncio.TimeoutError, ConnectionFailed]


def test_nothing_listening_is_a_connection_failure_and_line_breaks_cannot_add_headers():
    async def main():
        server, url, _ = await raw_server(echo_head)
        pool = Http1Pool(url, {"Authorization": "Bearer k"})
        _, _, head = await pool.post(b"{}", {"X-Rollout-Id": "t\r\nX-Evil: 1#0"})
        pool.close()
        server.close()
        closed = Http1Pool(url, {})
        try:
            await closed.post(b"{}")
        except ConnectionFailed as exc:
            return head.decode(), str(exc)
        return head.decode(), ""

    async def echo_head(request: bytes, writer: asyncio.StreamWriter) -> bool:
        head = request.split(b"\r\n\r\n")[0]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(head), head))
        return True

    head, error = run(main())
    lines = head.split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    assert "Authorization: Bearer k" in lines and "Content-Length: 2" in lines
    assert not any(line.startswith("X-Evil") for line in lines), "a line break in a value must not start a header"
    assert "cannot connect" in error


@pytest.mark.parametrize("client", ["auto", "aiohttp"])
def test_the_openai_model_gets_the_same_answers_over_either_client(client):
    async def main():
        async with fake_server(ScriptedServerConfig(policy="rollout.models.policies:bash_echo")) as server:
            model = OpenAIModel(OpenAIModelConfig(base_url=server.url, model="scripted", http_client=client))
            reply = await model.complete([{"role": "user", "content": "go"}])
            state = await model._state()
            lean = state.lean is not None
            await model.aclose()
            return reply, lean

    reply, lean = run(main())
    assert "echo step 1" in reply.message["content"]
    assert lean is (client == "auto")


def test_a_server_that_accepts_a_post_and_closes_without_answering_gets_it_at_most_twice():
    # Twelve pooled connections, then a server that reads the request and hangs up without answering: one post()
    # must not walk the whole pool (each arrival is a fresh generation on an LLM server).
    dropped: list[bytes] = []

    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"generate" in request:
            dropped.append(request)
            return False  # read, then closed without a byte of response
        await asyncio.sleep(0.05)  # held open together: the pool keeps twelve connections
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return True

    async def post(pool: Http1Pool) -> BaseException | None:
        try:
            await pool.post(b"generate")
        except BaseException as exc:  # noqa: BLE001 - the test looks at which
            return exc
        return None

    async def main():
        server, url, _ = await raw_server(handler)
        pool = Http1Pool(url, {})
        await asyncio.gather(*(pool.post(b"warm up") for _ in range(12)))
        pooled = len(pool._idle)
        error = await post(pool)
        pooled_arrivals = len(dropped)
        fresh = Http1Pool(url, {})  # no idle connection: nothing to blame on a stale one
        fresh_error = await post(fresh)
        pool.close()
        fresh.close()
        server.close()
        return pooled, error, pooled_arrivals, fresh_error, len(dropped) - pooled_arrivals

    pooled, error, pooled_arrivals, fresh_error, fresh_arrivals = run(main())
    assert pooled == 12
    assert pooled_arrivals <= 2, f"one post() reached the server {pooled_arrivals} times"
    assert isinstance(error, ConnectionFailed), "a retryable error, for the caller's bounded retries"
    assert isinstance(fresh_error, ConnectionFailed)
    assert fresh_arrivals == 1, "a request sent on a fresh connection is never resent"


def test_a_keep_alive_race_is_resent_once_over_a_fresh_connection():
    # The server answers one request per connection and hangs up on the next without answering (its keep-alive
    # ran out as the request came): nothing was answered, so the request goes again over a new connection.
    per_connection: dict[int, int] = {}

    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        seen = per_connection[id(writer)] = per_connection.get(id(writer), 0) + 1
        if seen > 1:
            return False
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return True

    async def main():
        server, url, _ = await raw_server(handler)
        pool = Http1Pool(url, {})
        answers = [await pool.post(b"x") for _ in range(3)]
        pool.close()
        server.close()
        return answers, pool.opened, sum(per_connection.values())

    answers, opened, arrivals = run(main())
    assert [a[2] for a in answers] == [b"ok"] * 3
    assert opened == 3 and arrivals == 5


MALFORMED = {
    "hex-prefixed chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                               b"0x10\r\n0123456789abcdef\r\n0\r\n\r\n",
    "negative content-length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
    "two content-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nhello",
}


@pytest.mark.parametrize("response", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_response_is_an_error_not_data(response):
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(response)
        return False

    async def main():
        server, url, _ = await raw_server(handler)
        pool = Http1Pool(url, {})
        try:
            return await pool.post(b"x")
        except ConnectionFailed as exc:
            return exc
        finally:
            pool.close()
            server.close()

    out = run(main())
    assert isinstance(out, ConnectionFailed), f"parsed as data: {out!r}"
    assert "malformed HTTP response" in str(out)


CUT = {
    "content-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b'{"choices": [{"mess'),
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b'13\r\n{"choices": [{"mess\r\n'),
    "until-close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b'{"choices": [{"mess'),
}


@pytest.mark.parametrize("head,partial", CUT.values(), ids=CUT.keys())
def test_a_body_cut_by_a_connection_reset_is_an_error_not_data(head, partial):
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(head + partial)
        await writer.drain()
        await asyncio.sleep(0.1)  # the partial body reaches the client before the reset
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        writer.transport.abort()
        return False

    async def main():
        server, url, _ = await raw_server(handler)
        pool = Http1Pool(url, {})
        try:
            return await pool.post(b"x")
        except ConnectionFailed as exc:
            return exc
        finally:
            pool.close()
            server.close()

    out = run(main())
    assert isinstance(out, ConnectionFailed), f"a cut body returned as data: {out!r}"
    assert "before the response ended" in str(out)


def test_a_body_that_ends_with_the_connection_is_whole_when_the_server_closes_cleanly():
    async def handler(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        return False

    async def main():
        server, url, _ = await raw_server(handler)
        pool = Http1Pool(url, {})
        out = await pool.post(b"x")
        pool.close()
        server.close()
        return out

    assert run(main())[::2] == (200, b"all of it")
