"""The built-in HTTP/1.1 client against real servers on 127.0.0.1: the fake OpenAI server, and raw asyncio
servers that answer the way other servers do (chunked, interim 100, Connection: close, dropped idle
connections, silence, garbage)."""

from __future__ import annotations

import asyncio
import json
from typing import Awaitable, Callable

import pytest

from rollout.models.fake_server import FakeServerConfig, fake_server
from rollout.models.http1 import ConnectionFailed, Http1Pool
from rollout.models.openai_client import OpenAIModel, OpenAIModelConfig

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
        async with fake_server(FakeServerConfig(policy="rollout.models.policies:bash_echo")) as server:
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
        async with fake_server(FakeServerConfig(policy="rollout.models.policies:bash_echo")) as server:
            model = OpenAIModel(OpenAIModelConfig(base_url=server.url, model="scripted", http_client=client))
            reply = await model.complete([{"role": "user", "content": "go"}])
            state = await model._state()
            lean = state.lean is not None
            await model.aclose()
            return reply, lean

    reply, lean = run(main())
    assert "echo step 1" in reply.message["content"]
    assert lean is (client == "auto")
