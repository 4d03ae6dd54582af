"""The gateway's upstream client against raw loopback servers: keep-alive reuse, the stale
connection race, limits, idle expiry, streamed bodies, early answers, and answers or fields
that must be refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from floodwall.gateway._client import (
    ConnectionPool,
    Origin,
    UpstreamConnectError,
    UpstreamDisconnectedError,
    UpstreamProtocolError,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[Origin]:
    """A raw TCP server on loopback running ``handler`` per connection."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Origin("127.0.0.1", port, tls=False)
    finally:
        server.close()
        await server.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def pool(**options: float) -> ConnectionPool:
    settings: dict[str, float] = {"limit": 10, "keepalive": 30.0, "connect_timeout": 1.0}
    settings.update(options)
    return ConnectionPool(
        limit=int(settings["limit"]),
        keepalive=settings["keepalive"],
        connect_timeout=settings["connect_timeout"],
    )


async def get(client: ConnectionPool, origin: Origin, method: str = "GET") -> tuple[int, bytes]:
    answer = await client.request(origin, method, "/x", [("Host", "svc")], None)
    try:
        return answer.status, await answer.read()
    finally:
        answer.release()


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            await read_head(reader)
            writer.write(OK)


async def test_connections_are_reused() -> None:
    async with serve(keep_alive) as origin:
        client = pool()
        for _ in range(5):
            assert await get(client, origin) == (200, b"ok")
        assert client.connects == 1
        assert (client.open, client.idle) == (1, 1)
        await client.close()
        assert client.open == 0


async def test_a_chunked_answer_and_a_head_answer() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await read_head(reader)
                if head.startswith(b"HEAD"):  # a length, and no body
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                    )

    async with serve(handler) as origin:
        client = pool()
        assert await get(client, origin) == (200, b"abcde")
        assert await get(client, origin, "HEAD") == (200, b"")
        assert await get(client, origin) == (200, b"abcde")
        assert client.connects == 1
        await client.close()


async def test_an_answer_without_length_ends_with_its_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello, ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"world")
        writer.close()

    async with serve(handler) as origin:
        client = pool()
        assert await get(client, origin) == (200, b"hello, world")
        assert client.open == 0  # never reused
        await client.close()


async def test_a_stale_connection_is_retried_once_for_idempotent_requests_only() -> None:
    served = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await read_head(reader)
            served += 1
            writer.write(OK)
            await writer.drain()
            await read_head(reader)  # the next request on this connection: hang up instead
            writer.close()

    async with serve(handler) as origin:
        client = pool()
        assert await get(client, origin) == (200, b"ok")
        assert await get(client, origin) == (200, b"ok")  # stale, then a fresh connection
        assert (served, client.connects) == (2, 2)
        with pytest.raises(UpstreamDisconnectedError):
            await get(client, origin, "POST")  # not idempotent: never sent twice
        assert served == 2
        await client.close()


async def test_limit_makes_requests_wait_and_times_out() -> None:
    async with serve(keep_alive) as origin:
        client = pool(limit=1, connect_timeout=0.2)
        first = await client.request(origin, "GET", "/", [], None)
        waiting = asyncio.ensure_future(get(client, origin))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await first.read()
        first.release()
        assert await waiting == (200, b"ok")
        assert client.connects == 1
        held = await client.request(origin, "GET", "/", [], None)
        with pytest.raises(UpstreamConnectError, match="no connection within"):
            await get(client, origin)
        held.release()
        await client.close()


async def test_idle_connections_expire() -> None:
    async with serve(keep_alive) as origin:
        client = pool(keepalive=0.05)
        await get(client, origin)
        assert client.idle == 1
        await asyncio.sleep(0.2)
        assert (client.idle, client.open) == (0, 0)
        await client.close()


async def test_refused_connection_is_a_connect_error() -> None:
    async with serve(keep_alive) as origin:
        closed = origin
    with pytest.raises(UpstreamConnectError):
        await get(pool(), closed)


async def test_streamed_body_is_chunked_and_an_early_answer_is_heard() -> None:
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await read_head(reader)
                if b"/early" in head:
                    writer.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(1)
                    writer.close()
                    return
                assert b"Transfer-Encoding: chunked" in head
                received.append(await reader.readuntil(b"0\r\n\r\n"))
                writer.write(OK)

    async def body(stall: bool) -> AsyncIterator[bytes]:
        yield b"hello "
        if stall:
            await asyncio.sleep(5)
        yield b"world"

    async with serve(handler) as origin:
        client = pool()
        answer = await client.request(origin, "POST", "/", [], body(stall=False))
        assert (answer.status, await answer.read()) == (200, b"ok")
        answer.release()
        assert received == [b"6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"]
        answer = await asyncio.wait_for(
            client.request(origin, "POST", "/early", [], body(stall=True)), 2
        )
        assert answer.status == 413
        await answer.read()
        answer.release()
        assert client.idle == 0  # the body was not sent whole: the connection is not reused
        await client.close()


async def test_smuggling_shaped_answers_are_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"
        )
        await writer.drain()

    async with serve(handler) as origin:
        client = pool()
        with pytest.raises(UpstreamProtocolError):
            await get(client, origin)
        assert client.open == 0
        await client.close()


async def test_a_field_with_a_line_break_is_never_written() -> None:
    async with serve(keep_alive) as origin:
        client = pool()
        with pytest.raises(ValueError, match="CR or LF"):
            await client.request(origin, "GET", "/", [("X-A", "b\r\nX-Injected: 1")], None)
        assert client.open == 0
        await client.close()


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n", "Invalid header field char"),
        (b"HTTP/1.1 200 OK\r\nX-A: \x01\r\nContent-Length: 2\r\n", "Invalid header value char"),
        (b"HTTP/1.1 200 O\x7fK\r\nContent-Length: 2\r\n", "reason phrase"),
        (b"HTTP/1.1 100 Continue\r\nX-Early: \x01\r\n\r\n", "Invalid header value char"),
    ],
)
async def test_an_answer_head_that_breaks_the_field_syntax_is_refused(
    head: bytes, why: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_head(reader)
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + head + b"\r\nok")

    async with serve(handler) as origin:
        client = pool()
        with pytest.raises(UpstreamProtocolError, match=why):
            await get(client, origin)
        assert (client.open, client.idle) == (0, 0)  # closed, never given back to the pool
        with pytest.raises(UpstreamProtocolError):
            await get(client, origin)
        assert client.connects == 2
        await client.close()


async def test_header_finds_the_first_value_of_a_field_in_any_case() -> None:
    """``header`` of the admission level (taken while the head is decoded) and of any other
    field: the first value, whatever case the upstream wrote the name in; ``None`` if absent."""
    answers = [
        b"HTTP/1.1 200 OK\r\nx-ADMISSION-level: 3\r\nX-Admission-Level: 5\r\n"
        b"Retry-After: 2\r\nContent-Length: 2\r\n\r\nok",
        OK,
    ]

    async def two_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await read_head(reader)
            writer.write(answer)
        await reader.read()

    client = pool()
    async with serve(two_answers) as origin:
        first = await client.request(origin, "GET", "/x", [("Host", "svc")], None)
        assert first.header("x-admission-level") == "3"
        assert first.header("retry-after") == "2"
        assert first.headers["x-admission-level"] == "3, 5"
        assert await first.read() == b"ok"
        first.release()
        second = await client.request(origin, "GET", "/x", [("Host", "svc")], None)
        assert second.header("x-admission-level") is None
        assert second.header("retry-after") is None
        second.release()
        await client.close()
