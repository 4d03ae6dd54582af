"""The gateway's HTTP/1.1 server protocol on a loopback socket: the requests of a keep-alive
connection are served in turn by one task, and nothing of an answered request stays referenced
while the connection waits for the next one."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable

import pytest

from floodwall.gateway._edge import EdgeRules
from floodwall.gateway._server import IDLE_DRAIN, HttpServer, Request, Response
from floodwall.gateway.config import EdgeConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


class _Answer(Response):
    __slots__ = ("__weakref__",)  # (to see when the last reference is gone)


def _server(
    handler: Callable[[Request], Awaitable[Response]], keepalive_timeout: float = 5.0
) -> HttpServer:
    """A server with the default edge rules and limits."""
    return HttpServer(
        handler,
        rules=EdgeRules(EdgeConfig()),
        head_timeout=5.0,
        keepalive_timeout=keepalive_timeout,
        max_line=8190,
        max_field=8190,
        max_headers=100,
    )


async def test_one_task_serves_a_keep_alive_connection_and_keeps_nothing_between() -> None:
    tasks: list[asyncio.Task[object] | None] = []
    answers: list[weakref.ref[Response]] = []

    async def handler(request: Request) -> Response:
        tasks.append(asyncio.current_task())
        answer = _Answer(200, [("Content-Type", "text/plain")], b"ok")
        answers.append(weakref.ref(answer))
        return answer

    server = _server(handler)
    listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):
            writer.write(b"GET /x HTTP/1.1\r\nHost: api\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await reader.readexactly(2) == b"ok"
        for _ in range(500):  # until the task waits for the next request (bounded: 5 s)
            gc.collect()
            if all(ref() is None for ref in answers):
                break
            await asyncio.sleep(0.01)
        assert len(tasks) == 3
        assert tasks[0] is not None
        assert all(task is tasks[0] for task in tasks)
        assert not tasks[0].done()  # waiting for the next request
        assert [ref() for ref in answers] == [None, None, None]
    finally:
        writer.close()
        await server.shutdown(1.0)
        listener.close()
        await listener.wait_closed()
    assert tasks[0] is not None
    for _ in range(500):  # until the closed connection's cancellation reaches its task (5 s)
        if tasks[0].done():
            break
        await asyncio.sleep(0.01)
    assert tasks[0].done()  # the client went away: the connection's task ended


async def test_a_shutdown_answers_the_next_request_of_an_idle_keep_alive_connection() -> None:
    """A keep-alive connection idle when a shutdown begins is not closed under the client's
    feet: the request it sends next is answered, with ``Connection: close``, then the
    connection closes; one that stays idle closes after ``IDLE_DRAIN``, within the grace."""

    async def handler(request: Request) -> Response:
        return Response(200, [("Content-Type", "text/plain")], b"ok")

    server = _server(handler, keepalive_timeout=30.0)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    active = await asyncio.open_connection("127.0.0.1", port)
    idle = await asyncio.open_connection("127.0.0.1", port)
    try:
        for reader, writer in (active, idle):
            writer.write(b"GET /x HTTP/1.1\r\nHost: api\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK\r\n")
            assert await reader.readexactly(2) == b"ok"
        listener.close()
        started = loop.time()
        shutdown = loop.create_task(server.shutdown(10.0))
        await asyncio.sleep(0)  # the shutdown began: both connections are idle
        assert server.closing
        reader, writer = active
        writer.write(b"GET /y HTTP/1.1\r\nHost: api\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nConnection: close\r\n" in head
        assert await reader.read() == b"ok"  # then the server closed it
        assert await idle[0].read() == b""  # the idle one: closed by the server
        await shutdown
        assert IDLE_DRAIN <= loop.time() - started < 10.0
        assert not server.connections
    finally:
        for _, writer in (active, idle):
            writer.close()
        await listener.wait_closed()


async def test_trailer_fields_stay_out_of_the_request_and_the_next_has_its_own_fields() -> None:
    """Fields are decoded as llhttp reports them: a chunked body's trailer fields (reported the
    same way) are not added to the request that was handed on, and the next request on the
    connection starts with fields of its own."""
    seen: list[tuple[dict[str, str], list[tuple[str, str]], bytes]] = []

    async def handler(request: Request) -> Response:
        body = b""
        if request.body is not None:
            while piece := await request.body.readany():
                body += piece
        seen.append((dict(request.headers), list(request.raw_headers), body))
        return Response(200, [("Content-Type", "text/plain")], b"ok")

    server = _server(handler)
    listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /x HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nhi\r\n0\r\nX-Trailer: late\r\n\r\n"
            b"GET /y HTTP/1.1\r\nhost: api\r\nX-Next: 1\r\n\r\n"
        )
        for _ in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await reader.readexactly(2) == b"ok"
    finally:
        writer.close()
        await server.shutdown(1.0)
        listener.close()
        await listener.wait_closed()
    assert seen == [
        (
            {"host": "api", "transfer-encoding": "chunked"},
            [("Host", "api"), ("Transfer-Encoding", "chunked")],
            b"hi",
        ),
        ({"host": "api", "x-next": "1"}, [("host", "api"), ("X-Next", "1")], b""),
    ]
