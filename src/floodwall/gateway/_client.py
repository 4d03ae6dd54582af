"""The gateway's upstream client: HTTP/1.1 keep-alive connections, parsed by llhttp.

Why not ``aiohttp.ClientSession.request``: per request it builds a URL, a timeout, a merged
header multidict, a ``ClientRequest`` (host, auth, cookies, proxy, encoding and body checks), a
connection key and a response object, about 80 µs of CPU on loopback. A reverse proxy already
holds a validated request: it needs a pooled connection, one write and the parsed answer. This
module does that with an asyncio protocol per connection and llhttp's response parser
(``httptools``, strict mode), and keeps:

* **strict answers**: conflicting ``Content-Length``/``Transfer-Encoding``, bad chunking,
  obs-fold, a field name that is not a token (``Content-Length : 8``) or a control character in
  a field value fail the answer in the parser; a control character in the reason phrase fails
  it here (:func:`~floodwall.gateway._headers.reason_error`), and so do a status line,
  field or field count past ``max_line``/``max_field``/``max_headers``, and so does a
  ``Transfer-Encoding`` other than one ``chunked``. The proxy answers 502 and a warning names
  the endpoint and the reason. Bytes after a whole answer do not fail it: it is passed on and
  its connection closed;
* a request head is written only when no field breaks its line (no CR/LF injection);
* a connection goes back to the pool only when its answer arrived whole, the request body was
  sent whole, and neither side asked to close; anything else closes it;
* ``limit`` connections in all and ``limit_per_origin`` per endpoint; a request beyond waits,
  at most ``connect_timeout`` (with the TCP connect itself);
* idle connections live ``keepalive`` seconds (one sweep timer per pool, not one per request);
* a connection the upstream closed while it was idle is retried once on a fresh connection
  when no byte of an answer came and the request can be sent again (idempotent method, body
  in memory): the keep-alive race every HTTP client must handle;
* answer bodies are buffered up to :data:`BODY_HIGH_WATER` bytes, then reading from the
  upstream pauses until the proxy takes them (flow control both ways).

Streamed request bodies are written by a task of their own while the answer is awaited, so an
upstream that answers early (say 413) is heard, and a stalled body never blocks the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final, NamedTuple

import httptools

from floodwall.gateway._headers import NAMES, decode_name, reason_error
from floodwall.integrations._wire import ADMISSION_LEVEL

__all__ = [
    "BODY_HIGH_WATER",
    "ConnectionPool",
    "Origin",
    "UpstreamConnectError",
    "UpstreamDisconnectedError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamResponse",
]

_LEVEL: Final = ADMISSION_LEVEL.lower()
"""The one field the outbound call reads from every answer (``x-admission-level``: the head's
loop finds it with the framing fields)."""
BODY_HIGH_WATER: Final = 256 * 1024
"""Answer body bytes buffered before the connection stops reading from the upstream."""
_NO_BODY_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})
"""Methods sent without ``Content-Length: 0`` when they carry no body."""
_REPLAYABLE: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""RFC 9110 §9.2.2 idempotent methods: safe to send again after a stale-connection race."""
log = logging.getLogger("floodwall.gateway")


class UpstreamError(ConnectionError):
    """The exchange with an endpoint broke (the base of this module's errors)."""


class UpstreamConnectError(UpstreamError):
    """No connection to the endpoint could be opened (refused, unreachable, TLS, timeout).

    ``reason``: why, without the endpoint's address (what a client may be told), or empty.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamDisconnectedError(UpstreamError):
    """The endpoint closed the connection before its answer was complete."""


class UpstreamProtocolError(UpstreamError):
    """The endpoint's answer is not valid HTTP/1.1 (or asks for an upgrade the gateway does
    not proxy)."""


class Origin(NamedTuple):
    """Where an endpoint's connections go."""

    host: str
    port: int
    tls: bool


class _Limits(NamedTuple):
    max_line: int
    max_field: int
    max_headers: int


class UpstreamResponse:
    """An upstream answer whose body is read with :meth:`read` / :meth:`readany`;
    :meth:`release` gives the connection back (or closes it when the answer is not whole)."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_error",
        "_headers",
        "_level",
        "_paused",
        "_pool",
        "_size",
        "_waiter",
        "_writer",
        "complete",
        "connection",
        "content_length",
        "endpoint",
        "raw_headers",
        "reason",
        "status",
    )

    def __init__(  # noqa: PLR0917 - built per answer: positional arguments cost less
        self,
        connection: _Connection,
        status: int,
        reason: str,
        raw_headers: list[tuple[str, str]],
        content_length: int | None,
        level: str | None,
    ) -> None:
        self._pool: ConnectionPool | None = None
        self._connection: _Connection | None = connection
        self._writer: asyncio.Task[None] | None = None
        self.status = status
        self.reason = reason
        self.raw_headers = raw_headers
        """Every field as received, in order (names as the upstream wrote them)."""
        self._headers: dict[str, str] | None = None
        self._level = level
        """The first ``X-Admission-Level`` value (see :meth:`header`): found by the head's
        decoding loop with the framing fields."""
        self.content_length = content_length
        self.connection: str | None = None
        """The answer's ``Connection`` field, if it has one."""
        self.complete = False
        """Whether the whole body has arrived (read or not)."""
        self.endpoint: Any = None
        """Whatever the caller notes beside the answer (the proxy: the endpoint it came from)."""
        self._chunks: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._paused = False

    @property
    def headers(self) -> dict[str, str]:
        """Lower-case names to values (a repeated field joined with ``", "``)."""
        headers = self._headers
        if headers is None:
            headers = {}
            for name, value in self.raw_headers:
                lower = name.lower()
                headers[lower] = f"{headers[lower]}, {value}" if lower in headers else value
            self._headers = headers
        return headers

    def header(self, name: str) -> str | None:
        """The first value of field ``name`` (lower-case), without building :attr:`headers`."""
        if name == _LEVEL:  # (asked of every answer: found while its head was decoded)
            return self._level
        for field, value in self.raw_headers:
            if len(field) == len(name) and field.lower() == name:
                return value
        return None

    # -- the connection's side --------------------------------------------------------------

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self.complete:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- reading ----------------------------------------------------------------------------

    def is_eof(self) -> bool:
        """Whether the whole body has arrived and been read."""
        return self.complete and not self._chunks

    @property
    def ready(self) -> bool:
        """Whether :meth:`readany` returns without waiting."""
        return bool(self._chunks) or self.complete or self._error is not None

    async def readany(self) -> bytes:
        """What has arrived of the body (waiting for some), ``b""`` at its end (the caller
        bounds the wait); the connection's failure if it broke before the end."""
        while not self._chunks:
            if self.complete:
                return b""
            await self._more()
        chunks = self._chunks
        data = _join(chunks)  # (one piece: the piece itself, no copy)
        chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            connection = self._connection
            if connection is not None and connection.transport is not None:
                connection.transport.resume_reading()
        return data

    async def arrived(self) -> None:
        """Wait until the whole body has arrived, kept for :meth:`take` (the caller bounds the
        wait; for bodies up to :data:`BODY_HIGH_WATER`, past which reading pauses); the
        connection's failure if it broke before the end."""
        while not self.complete:
            await self._more()

    async def _more(self) -> None:
        """Wait for more of the body (or its end); the connection's failure if it broke."""
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        """The whole body, once it has all arrived (:attr:`complete`)."""
        chunks = self._chunks
        data = _join(chunks)  # (one piece: the piece itself, no copy)
        chunks.clear()
        return data

    async def read(self, limit: int = -1) -> bytes:
        """The whole body (or its first ``limit`` bytes); the caller bounds the wait."""
        if self.complete and limit < 0:
            return self.take()
        parts: list[bytes] = []
        size = 0
        while limit < 0 or size < limit:
            chunk = await self.readany()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
        return data if limit < 0 else data[:limit]

    def release(self) -> None:
        """Give the connection back if the exchange is complete, else close it. Idempotent."""
        connection = self._connection
        if connection is None:
            return
        self._connection = None
        writer = self._writer
        if writer is None:  # (no streamed body: the common case)
            sent = True
        else:
            sent = writer.done() and not writer.cancelled() and not writer.exception()
            if not writer.done():
                writer.cancel()
        pool = self._pool
        if pool is None:
            return
        pool.release(connection, sent and self.complete and not self._paused)


class _Connection(asyncio.Protocol):
    """One upstream connection: llhttp's response parser and the pool's bookkeeping."""

    def __init__(self, origin: Origin, limits: _Limits) -> None:
        self.origin = origin
        self.limits = limits
        # (read per answer: plain attributes, a NamedTuple's field reads are not specialised)
        self.max_line, self.max_field, self.max_headers = limits
        self._head_cap = limits.max_line + limits.max_headers * (limits.max_field + 4)
        """Bytes an answer head may take before it is refused, whatever its shape."""
        self._small_head = min(limits.max_line, limits.max_field)
        """A whole head up to this size breaks no line or field limit (see _head_error)."""
        self.loop = asyncio.get_running_loop()
        self._reason: list[bytes] = []
        self.on_status = self._reason.append
        """The parser's reason-phrase callback (httptools looks it up when a parser is made):
        the pieces appended in C, no Python frame per answer; taken when the head is complete."""
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.used = False
        """Whether a request went out on it (a reused connection may have gone stale)."""
        self.answered = False
        """Whether the current exchange got an answer head."""
        self.should_close = False
        self.writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[UpstreamResponse] | None = None
        self._response: UpstreamResponse | None = None
        self._fields: list[tuple[bytes, bytes]] = []
        self._until_eof = False
        self._error: str | None = None
        self._head_bytes = 0

    def is_connected(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- one exchange -----------------------------------------------------------------------

    # -- the transport's side ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.should_close = True
        response = self._response
        if response is not None and not response.complete:
            if self._until_eof and self._error is None:
                response._finish()
            else:
                response._fail(UpstreamDisconnectedError("the upstream closed mid-answer"))
        self._fail(UpstreamDisconnectedError("the upstream closed the connection"))
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(UpstreamDisconnectedError("the upstream closed the connection"))

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self) -> None:
        if self.writing_paused:
            self._drain = self.loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    def data_received(self, data: bytes) -> None:
        if self._response is None:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._error = "the upstream switched protocols (not proxied)"
        except httptools.HttpParserError as exc:
            if self._after_answer():
                return
            said = str(exc).strip()
            self._error = self._error or (said.splitlines()[0] if said else "unparsable")
        if self._error is None and self._response is None and self._head_bytes > self._head_cap:
            self._error = "the answer head is too large"
        if self._error is not None:
            self._invalid(self._error)
            return
        waiter = self._waiter  # the head, once the whole read parsed: an answer whose body is
        response = self._response  # malformed in the same read fails before it is handed on
        if self.head_mode and response is not None and not self.should_close:
            # llhttp cannot be told that an answer to HEAD has no body: a fresh parser for the
            # next answer (any byte after this head made should_close, in on_body)
            self.parser = httptools.HttpResponseParser(self)
        if waiter is not None and response is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(response)

    def eof_received(self) -> bool | None:
        return None

    def _after_answer(self) -> bool:
        """Whether the bytes llhttp just refused came after a whole answer (more than its
        ``Content-Length``, a body after a 204 or 304): the answer stands, as nginx and
        HAProxy pass it on, and the connection is closed, never reused (those bytes would be
        read as the next request's answer; the answer's body is all buffered already). A
        warning names the endpoint."""
        response = self._response
        if response is None or not response.complete or self._error is not None:
            return False
        if not self.should_close:
            origin = self.origin
            log.warning(
                "upstream %s:%d sent bytes after a complete answer (closed, not reused)",
                origin.host,
                origin.port,
            )
            self.should_close = True
            self.parser = _IGNORE  # type: ignore[assignment]
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(response)
        if self.transport is not None:
            self.transport.close()
        return True

    def _invalid(self, why: str) -> None:
        origin = self.origin
        log.warning("upstream %s:%d sent an invalid answer: %s", origin.host, origin.port, why)
        self.should_close = True
        error = UpstreamProtocolError(f"invalid answer: {why}")
        response = self._response
        if response is not None:
            response._fail(error)
        self._fail(error)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self._waiter = None

    # -- the parser's callbacks -------------------------------------------------------------

    # (No on_message_begin: each head's status and fields are taken, and reset, when the head
    # is complete; one Python call fewer from C per answer. on_status: see __init__.)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name, value))

    def on_headers_complete(self) -> None:  # noqa: PLR0912 - the usual head without a call
        fields, pieces = self._fields, self._reason
        self._fields = []
        reason_bytes = _join(pieces)  # (one piece, the usual: that piece itself)
        pieces.clear()
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:
                self._error = "the upstream switched protocols (not proxied)"
            return  # 1xx: the answer is still to come
        self.answered = True
        if (
            reason_bytes == b"OK"
            and len(fields) <= self.max_headers
            and self._head_bytes <= self._small_head
        ):  # the usual head: none of _head_error's tests can fail (no call for it)
            reason = "OK"
            self._error = None
        else:
            reason = reason_bytes.decode("latin-1")
            self._error = self._head_error(reason, len(reason_bytes), fields)
            if self._error is not None:
                return
        raw: list[tuple[str, str]] = []
        length: int | None = None
        coding: str | None = None
        connection: str | None = None
        level: str | None = None
        names, kinds = NAMES, _KINDS
        for field_name, field_value in fields:
            name, lower = names.get(field_name) or decode_name(field_name)
            value = field_value.decode("latin-1")
            raw.append((name, value))
            kind = kinds.get(lower)
            if kind is not None:
                if kind == _LENGTH:
                    length = int(value)
                elif kind == _TRANSFER:
                    coding = value if coding is None else f"{coding}, {value}"
                elif kind == _CONNECTION:
                    connection = value if connection is None else f"{connection}, {value}"
                elif level is None:  # (_ADMISSION)
                    level = value
        if coding is not None and coding.strip().lower() != "chunked":
            self._error = _CODING  # (only one chunked: see _CODING)
            return
        chunked = coding is not None
        if not self.parser.should_keep_alive():
            self.should_close = True
        head_mode = self.head_mode
        self._until_eof = until_eof = length is None and not chunked and status not in (204, 304)
        if until_eof and not head_mode:
            self.should_close = True
        self._response = response = _new_response(UpstreamResponse)
        _init_response(response, self, status, reason, raw, length, level)
        response.connection = connection
        response.complete = head_mode or status in (204, 304)

    head_mode = False
    """Whether the current exchange answers a ``HEAD`` (no body follows its head)."""

    def _head_error(
        self, reason: str, status_line: int, fields: list[tuple[bytes, bytes]]
    ) -> str | None:
        """Why the answer head may not be used (sizes, then syntax), or ``None``."""
        if status_line > self.max_line:
            return "the status line is too long"
        if len(fields) > self.max_headers:
            return "too many answer fields"
        max_field = self.max_field
        if self._head_bytes > max_field and any(len(n) + len(v) > max_field for n, v in fields):
            return "an answer field is too long"
        # (llhttp's strict mode already refused names that are not tokens and control
        # characters in values; :func:`answer_head_error` states the whole rule)
        return None if reason == "OK" else reason_error(reason)

    def on_body(self, body: bytes) -> None:
        response = self._response
        if self.head_mode:
            self.should_close = True  # bytes after an answer to HEAD: not HTTP/1.1 as it is
        elif response is not None:  # the answer's body buffered (here: one call per piece)
            response._chunks.append(body)
            size = response._size = response._size + len(body)
            if size > BODY_HIGH_WATER and not response._paused:
                transport = self.transport  # (not once the answer was released)
                if response._connection is not None and transport is not None:
                    response._paused = True
                    transport.pause_reading()
            waiter = response._waiter  # (_wake, inline: called for every piece of every body)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        response = self._response
        if response is not None and self._error is None:
            response.complete = True  # (UpstreamResponse._finish, inline)
            waiter = response._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


_LENGTH, _TRANSFER, _CONNECTION, _ADMISSION = 1, 2, 3, 4
_KINDS: Final = {
    "content-length": _LENGTH,
    "transfer-encoding": _TRANSFER,
    "connection": _CONNECTION,
    _LEVEL: _ADMISSION,
}
"""The answer fields the head's loop reads, by lower-case name."""
_CODING: Final = "a Transfer-Encoding other than one chunked"
"""Why an answer with ``chunked, chunked`` or ``gzip, chunked`` is refused (502, HAProxy's
answer too): the gateway drops the field and frames the body itself, so a coding under
``chunked`` would reach the client unannounced, and a repeated one is a smuggling shape."""


class _Ignore:
    """Stands in for the parser once a whole answer was followed by stray bytes."""

    def feed_data(self, data: bytes) -> None:
        return None


_IGNORE: Final = _Ignore()

_new_response = object.__new__
_init_response = UpstreamResponse.__init__
"""``UpstreamResponse(...)`` in two calls from Python: on CPython 3.11 a class call with a
Python ``__init__`` re-enters the interpreter from C (``Admission`` is built the same way)."""


class ConnectionPool:
    """Keep-alive HTTP/1.1 connections to any number of :class:`Origin` (see the module).

    Create and use it inside the event loop that serves the requests.
    """

    def __init__(
        self,
        *,
        limit: int,
        limit_per_origin: int = 0,
        keepalive: float,
        connect_timeout: float,
        max_line: int = 8190,
        max_field: int = 8190,
        max_headers: int = 128,
        ssl_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.limit = limit
        self.limit_per_origin = limit_per_origin or limit
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self._limits = _Limits(max_line, max_field, max_headers)
        self._ssl = ssl_context
        """TLS origins' context (default: the system's trust store, made on first use)."""
        self._server_name = server_name
        """The name TLS origins are asked for and checked against (default: their host)."""
        self._loop = asyncio.get_running_loop()
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._open: dict[Origin, int] = {}
        self._total = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self.connects = 0
        """TCP connections opened so far (a pool that works keeps this low)."""

    # -- one exchange ----------------------------------------------------------------------------

    async def request(  # noqa: PLR0912, PLR0915 - the usual exchange without helper calls
        self,
        origin: Origin,
        method: str,
        target: str,
        fields: list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        *,
        fixed: str = "",
    ) -> UpstreamResponse:
        """Send ``method target`` with ``fields`` (no hop-by-hop or framing fields: the pool
        writes ``Content-Length`` or chunked framing itself, unless ``fields`` declares a
        ``Content-Length`` for a streamed body) and wait for the answer's head. ``fixed``:
        more fields as head lines (``name: value`` and CRLF each) the caller made once and
        checked for CR and LF itself, written after ``fields``."""
        # The head, built here (a Python call fewer per request); ValueError if a field would
        # break a line (header injection). The framing last: see _chunked.
        streamed = False
        if body is None:
            framing = "" if method in _NO_BODY_METHODS else "Content-Length: 0\r\n"
        elif isinstance(body, bytes):
            framing = f"Content-Length: {len(body)}\r\n"
        else:
            streamed = True
            declared = any(name.lower() == "content-length" for name, _ in fields)
            framing = "" if declared else "Transfer-Encoding: chunked\r\n"
        # (C loops, no Python frame per field; str.join costs about half of a "%s: %s" format)
        lines = [f"{method} {target} HTTP/1.1", *map(_field, fields)]
        # The lines without their breaks, tested with two memchr scans: two str.count calls
        # over the head cost about twice as much (their argument parsing, a loop per character)
        probe = _cat(lines)
        if "\r" in probe or "\n" in probe:
            raise ValueError("a request field contains CR or LF")
        lines.append(f"{fixed}{framing}\r\n")
        text = _lines(lines)
        try:
            head = text.encode("latin-1")
        except UnicodeEncodeError:
            head = text.encode("utf-8")
        replayable = not streamed and method in _REPLAYABLE
        while True:
            connection = self._reuse(origin)
            if connection is None:
                connection = await self._acquire(origin)
            reused = connection.used
            connection.head_mode = method == "HEAD"
            transport = connection.transport
            writer: asyncio.Task[None] | None = None
            try:
                if transport is None or transport.is_closing():
                    raise UpstreamDisconnectedError("the upstream closed the connection")
                connection.used = True  # the exchange begins: a future for its answer head
                connection.answered = False
                connection._response = None
                connection._head_bytes = 0
                waiter: asyncio.Future[UpstreamResponse] = self._loop.create_future()
                connection._waiter = waiter
                if body is None:
                    transport.write(head)
                elif not streamed:
                    transport.writelines((head, body))  # type: ignore[arg-type]
                else:
                    transport.write(head)
                    sending = _send_body(connection, body, _chunked(head))  # type: ignore[arg-type]
                    writer = self._loop.create_task(sending)
                    writer.add_done_callback(_on_body_sent)
                response = await waiter
            except (UpstreamDisconnectedError, UpstreamProtocolError):
                self._give_up(connection, writer)
                if not (reused and replayable and not connection.answered):
                    raise
                replayable = False  # once
                continue
            except BaseException:
                self._give_up(connection, writer)
                raise
            response._pool = self
            response._writer = writer
            return response

    def _give_up(self, connection: _Connection, writer: asyncio.Task[None] | None) -> None:
        if writer is not None:
            writer.cancel()
        self.release(connection, False)

    # -- the pool --------------------------------------------------------------------------------

    async def _acquire(self, origin: Origin) -> _Connection:
        connection = self._reuse(origin)
        if connection is not None:
            return connection
        if self._closed:
            raise UpstreamConnectError("the connection pool is closed")
        try:
            async with asyncio.timeout(self.connect_timeout):
                return await self._new(origin)
        except TimeoutError:
            raise UpstreamConnectError(
                f"{origin.host}:{origin.port}: no connection within {self.connect_timeout:g}s"
            ) from None

    def _reuse(self, origin: Origin) -> _Connection | None:
        """The most recently used idle connection to ``origin`` still open (LIFO keeps the
        working set small and warm), or ``None``."""
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            transport = connection.transport  # (is_connected(), inline: once per request)
            if transport is not None and not transport.is_closing() and not connection.should_close:
                return connection
            self._forget(connection)
        return None

    async def _new(self, origin: Origin) -> _Connection:
        """A connection to ``origin`` once the limits leave room (or an idle one came back)."""
        while not self._room_for(origin):
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
            connection = self._reuse(origin)
            if connection is not None:
                return connection
        self._total += 1
        self._open[origin] = self._open.get(origin, 0) + 1
        try:
            return await self._connect(origin)
        except BaseException:
            self._total -= 1
            self._open[origin] -= 1
            self._wake()
            raise

    def _room_for(self, origin: Origin) -> bool:
        if self._open.get(origin, 0) >= self.limit_per_origin:
            return False
        if self._total < self.limit:
            return True
        for other, idle in self._idle.items():  # full: make room by closing another's idle one
            if other != origin and idle:
                self._forget(idle.popleft())
                return True
        return False

    async def _connect(self, origin: Origin) -> _Connection:
        loop = self._loop
        context = name = None
        if origin.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context, name = self._ssl, self._server_name or origin.host
        try:
            limits = self._limits
            _, connection = await loop.create_connection(
                lambda: _Connection(origin, limits),
                origin.host,
                origin.port,
                ssl=context,
                server_hostname=name,
            )
        except ssl.SSLCertVerificationError as exc:
            why = f"TLS: the upstream's certificate is not trusted ({exc.verify_message})"
            raise UpstreamConnectError(f"{origin.host}:{origin.port}: {why}", why) from exc
        except ssl.SSLError as exc:
            why = f"TLS handshake failed ({exc.reason or exc})"
            raise UpstreamConnectError(f"{origin.host}:{origin.port}: {why}", why) from exc
        except OSError as exc:
            raise UpstreamConnectError(f"{origin.host}:{origin.port}: {exc}") from exc
        self.connects += 1
        return connection

    def release(self, connection: _Connection, reusable: bool) -> None:
        """Back to the idle list (``reusable`` and healthy), or closed; a waiter is woken."""
        transport = connection.transport  # (is_connected(), inline: once per request)
        if (
            reusable
            and not self._closed
            and transport is not None
            and not transport.is_closing()
            and not connection.should_close
        ):
            connection.idle_since = self._loop.time()
            idle = self._idle.get(connection.origin)
            if idle is None:
                idle = self._idle[connection.origin] = deque()
            idle.append(connection)
            if self._sweeper is None:
                self._sweeper = self._loop.call_later(self.keepalive, self._sweep)
            if self._waiters:
                self._wake()
            return
        self._forget(connection)

    def _forget(self, connection: _Connection) -> None:
        connection.close()
        self._total -= 1
        self._open[connection.origin] -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        """Close connections idle for longer than ``keepalive`` (oldest first in each list)."""
        self._sweeper = None
        horizon = self._loop.time() - self.keepalive
        left = False
        for idle in self._idle.values():
            while idle and idle[0].idle_since <= horizon:
                self._forget(idle.popleft())
            left = left or bool(idle)
        if left:
            self._sweeper = self._loop.call_later(self.keepalive, self._sweep)

    @property
    def idle(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    @property
    def open(self) -> int:
        """Connections open (in use and idle)."""
        return self._total

    async def close(self) -> None:
        """Close the idle connections now; busy ones close when released."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in self._idle.values():
            while idle:
                self._forget(idle.popleft())
        await asyncio.sleep(0)  # let the transports run their connection_lost


# -- the wire ------------------------------------------------------------------------------------


_field = ": ".join
_lines = "\r\n".join
_cat = "".join
_join = b"".join
"""A field's line, a head's lines (with and without breaks) and a body's pieces, joined in C
(bound once: each ``": ".join`` written in a function makes a bound method per call)."""


def _chunked(head: bytes) -> bool:
    return head.endswith(b"Transfer-Encoding: chunked\r\n\r\n")


async def _send_body(connection: _Connection, body: AsyncIterator[bytes], chunked: bool) -> None:
    """Write a streamed body; the connection is aborted if it fails (the answer then fails)."""
    try:
        async for chunk in body:
            transport = connection.transport
            if transport is None:
                raise UpstreamDisconnectedError("the upstream closed the connection")
            if chunked:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            else:
                transport.write(chunk)
            await connection.drain()
        if chunked and connection.transport is not None:
            connection.transport.write(b"0\r\n\r\n")
    except BaseException:
        transport = connection.transport
        if transport is not None:
            transport.abort()
        raise


def _on_body_sent(task: asyncio.Task[None]) -> None:
    """Retrieve the writer's failure (the answer's failure is what callers see)."""
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.exception()
