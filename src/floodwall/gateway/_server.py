"""The HTTP/1.1 server under the proxy: one asyncio protocol per connection over llhttp.

Why not ``aiohttp.web``: per request it builds a ``RawRequestMessage`` with a yarl URL and a
multidict, a ``StreamReader``, a ``BaseRequest``, a ``Response`` with its own multidict, and
serialises the answer in several steps; for a proxy that already knows what it forwards, that
was about a third of the gateway's CPU per request. This module keeps what mattered:

* **parsing** is llhttp's, through ``httptools`` (the C parser aiohttp and Node.js use), in its
  strict mode: conflicting ``Content-Length``/``Transfer-Encoding``, repeated or signed
  ``Content-Length``, obfuscated ``Transfer-Encoding``, whitespace before a colon, obs-fold,
  bare CR or LF and control characters are refused before a request exists. On top of it, the
  line and field limits (414 for a long target, 431 for a long field or too many), a repeated
  ``Host`` (400) and the :class:`~floodwall.gateway._edge.EdgeRules`. Bytes after a request
  that closes the connection are never read (that request is served, no 400);
* **slow clients**: from the first byte of a request head, the whole head must arrive within
  ``head_timeout`` seconds (slowloris); an idle keep-alive connection closes after
  ``keepalive_timeout``; a head still arriving past the edge's ``max_head`` is refused (431)
  before it grows further. One timer per connection, re-armed lazily (never one per request);
* **bodies** arrive through :class:`RequestBody` with flow control (reading pauses above
  :data:`BODY_HIGH_WATER` buffered bytes);
* **answers** are written in one ``write`` of head and body (:meth:`Connection.send`), or
  streamed (:meth:`Connection.begin`, :meth:`Connection.write`, :meth:`Connection.end`) with
  the transport's flow control; a field that would break its line is never written;
* one task per connection serves its requests in turn (pipelined ones in order, one waiting
  while another is served); a client that goes away cancels it; :meth:`HttpServer.shutdown`
  stops gracefully.

Every refusal is a problem document that closes the connection, logged at debug level in one
line (no traceback, no request bytes quoted back). The ``Server`` field is the configuration's
(none by default), on refusals too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import httptools

from floodwall.gateway._edge import EdgeRefusal, EdgeRules, upgrade_refusal
from floodwall.gateway._headers import NAMES, decode_name
from floodwall.integrations._wire import PROBLEM_JSON, problem

__all__ = [
    "BODY_HIGH_WATER",
    "Connection",
    "HttpServer",
    "Request",
    "RequestBody",
    "Response",
    "listen_socket",
    "no_server_field",
    "parse_head",
    "parser_refusal",
]

quiet = logging.getLogger("floodwall.gateway.protocol")
"""Malformed requests and slow clients, one debug line each."""
log = logging.getLogger("floodwall.gateway")

BODY_HIGH_WATER: Final = 256 * 1024
"""Request body bytes buffered before the connection stops reading from the client."""
_IDLE, _HEAD, _BUSY, _DRAIN = 0, 1, 2, 3
"""Between requests; a head arriving; a request being served; its unread body read away."""
_REASONS: Final = {s.value: s.phrase for s in HTTPStatus}
_NO_BODY_STATUS: Final = frozenset({204, 304})

Handler = Callable[["Request"], Awaitable["Response"]]


_field = ": ".join
_lines = "\r\n".join
"""A field's line and a head's lines, joined in C (bound once: each ``": ".join`` written
in a function makes a bound method per call)."""


class RequestBody:
    """A request body as it arrives: :meth:`readany` returns what is buffered (``b""`` at its
    end); reading from the client pauses while more than :data:`BODY_HIGH_WATER` bytes wait."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_error",
        "_paused",
        "_size",
        "_waiter",
        "discard",
        "eof",
    )

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._paused = False
        self.eof = False
        self.discard = False
        """Set once the request was answered without reading it all: the rest is dropped."""

    def feed(self, data: bytes) -> None:
        if self.discard:
            return
        self._chunks.append(data)
        self._size += len(data)
        if self._size > BODY_HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self.eof = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.eof:
            self._error = error
            self._wake()

    def is_eof(self) -> bool:
        """Whether the whole body has arrived and been read."""
        return self.eof and not self._chunks

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def readany(self) -> bytes:
        """The bytes buffered now (waiting for some), ``b""`` once the body has ended;
        ``ConnectionResetError`` if the client went away before it ended."""
        while not self._chunks:
            if self.eof:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            self._connection.resume_reading()
        return data


class Request:
    """One parsed request head (and its body, if any) as the proxy sees it.

    ``headers`` maps lower-case names to values (a repeated field joined with ``", "``, as
    :class:`~floodwall.integrations._inbound.Inbound` wants them); ``raw_headers`` keeps every
    field as received, in order. ``path`` is the percent-decoded path, ``raw_path`` the path as
    sent (no query), ``path_qs`` the path and query as sent. ``host`` is the ``Host`` field,
    or an absolute-form target's authority (RFC 9112 §3.2.2: the target wins)."""

    __slots__ = (
        "absolute",
        "body",
        "connection",
        "content_length",
        "head_size",
        "headers",
        "host",
        "keep_alive",
        "method",
        "path",
        "path_qs",
        "raw_headers",
        "raw_path",
        "remote",
        "scheme_of_target",
        "target",
        "version",
    )

    scheme: Final = "http"

    def __init__(
        self,
        method: str,
        target: str,
        version: str,
        raw_headers: list[tuple[str, str]],
        headers: dict[str, str],
    ) -> None:
        self.method = method
        self.target = target
        self.version = version
        """``"1.1"``, ``"1.0"`` (anything else is refused by the edge rules)."""
        self.raw_headers = raw_headers
        self.headers = headers
        self.head_size = 0
        """The request line and fields as parsed (name, ``: ``, value, CRLF each), in bytes."""
        self.host = headers.get("host", "")
        self.absolute: str | None = None
        """An absolute-form target's authority (``None``: origin form)."""
        self.scheme_of_target = ""
        if target[:1] == "/":
            raw_path, _, _ = target.partition("?")
            self.path_qs = target
        elif target == "*":
            raw_path = self.path_qs = "*"
        else:
            raw_path = self._absolute(target)
        self.raw_path = raw_path
        self.path = unquote(raw_path, errors="replace") if "%" in raw_path else raw_path
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None else None
        self.body: RequestBody | None = None
        self.remote: str | None = None
        self.keep_alive = True
        self.connection: Connection | None = None

    def _absolute(self, target: str) -> str:
        parts = urlsplit(target)
        self.scheme_of_target = parts.scheme
        self.absolute = parts.netloc
        raw_path = parts.path or "/"
        self.path_qs = f"{raw_path}?{parts.query}" if parts.query else raw_path
        self.host = self.absolute
        return raw_path

    @property
    def body_exists(self) -> bool:
        return self.body is not None


class Response:
    """An answer: status, fields (in order), and a body sent in one write."""

    __slots__ = ("body", "clean", "close", "headers", "reason", "sent", "status", "tail")

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        *,
        reason: str | None = None,
        close: bool = False,
    ) -> None:
        self.status = status
        self.headers = headers if headers is not None else []
        self.body = body
        self.reason = reason
        self.close = close
        self.sent = False
        """Set once the answer went out (a streamed answer sends itself)."""
        self.clean = False
        """Whether :attr:`headers` hold none of the fields the gateway adds (request id, rate
        limit): they are appended without a look for an earlier field of the same name."""
        self.tail = ""
        """Fields written after :attr:`headers` as they are (``name: value`` and CRLF each,
        made once per distinct value: the route's ``RateLimit-*`` and request id); :meth:`get`
        and :meth:`set` do not see them."""

    def set(self, name: str, value: str) -> None:
        """Set field ``name`` (any case) to ``value``, replacing what it had."""
        lower = name.lower()
        headers = self.headers
        if any(n.lower() == lower for n, _ in headers):
            headers[:] = [(n, v) for n, v in headers if n.lower() != lower]
        headers.append((name, value))

    def get(self, name: str) -> str | None:
        lower = name.lower()
        for n, v in self.headers:
            if n.lower() == lower:
                return v
        return None


LENGTHS: Final = 1024
"""Answer lengths whose ``Content-Length`` line is kept (beyond, each is formatted every time)."""
_LENGTHS: dict[int, str] = {}


def _length_line(length: int) -> str:
    """The ``Content-Length`` line for ``length``, kept for the next answer of that length (up
    to :data:`LENGTHS`; looked up as ``_LENGTHS.get(length) or _length_line(length)``): a
    route's answers repeat a few lengths, and formatting the number costs about 0.5 k
    instructions, the lookup a third of it."""
    line = f"Content-Length: {length}\r\n"
    if len(_LENGTHS) < LENGTHS:
        _LENGTHS[length] = line
    return line


STATUS_LINES: Final = 256
"""Status lines kept (beyond, each is formatted every time)."""
_STATUS_LINES: dict[tuple[str, int, str | None], str] = {}


def _status_line(version: str, status: int, reason: str | None) -> str:
    """An answer's status line, kept for the next answer of that version, status and reason
    (up to :data:`STATUS_LINES`; looked up as ``_STATUS_LINES.get((version, status, reason))
    or _status_line(version, status, reason)``): formatting the status and looking up its
    phrase cost more than the lookup."""
    line = f"HTTP/{version} {status} {reason or _REASONS.get(status, 'Unknown')}\r\n"
    if len(_STATUS_LINES) < STATUS_LINES:
        _STATUS_LINES[version, status, reason] = line
    return line


_new_request = object.__new__
_init_request = Request.__init__
"""A request in two calls from Python: on CPython 3.11 a class call with a Python
``__init__`` re-enters the interpreter from C (the inbound guard builds its ``Admission`` the
same way)."""


def problem_response(refusal: EdgeRefusal) -> Response:
    """The problem document for ``refusal``; the connection closes after it."""
    body = problem(refusal.status, refusal.kind, refusal.detail)
    return Response(refusal.status, [("Content-Type", PROBLEM_JSON)], body, close=True)


class _Date:
    """The ``Date`` field's value, formatted once a second."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = 0
        """The whole second :attr:`value` is for: a time in ``[second, second + 1)`` needs no
        new value (tested with float comparisons per answer, not an ``int()`` call)."""
        self.value = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self.second:
            self.second = second
            self.value = formatdate(second, usegmt=True)
        return self.value


_DATE = _Date()


class HttpServer:
    """The protocol factory of a listener: ``handler`` answers every admitted request.

    Assign :attr:`rules` to change the edge rules (a reload): open connections apply them to
    their next request."""

    def __init__(
        self,
        handler: Handler,
        *,
        rules: EdgeRules,
        head_timeout: float,
        keepalive_timeout: float,
        max_line: int,
        max_field: int,
        max_headers: int,
    ) -> None:
        self.handler = handler
        self.rules = rules
        self.head_timeout = head_timeout
        self.keepalive_timeout = keepalive_timeout
        self.max_line = max_line
        self.max_field = max_field
        self.max_headers = max_headers
        self.connections: set[Connection] = set()
        self.closing = False

    def __call__(self) -> Connection:
        return Connection(self)

    async def shutdown(self, grace: float) -> None:
        """Let every connection finish the request it is serving or sending, for up to
        ``grace`` seconds, then close all. Each closes after its next answer (sent with
        ``Connection: close``); one just accepted gets :data:`FRESH_GRACE` for its first head;
        one idle between requests is kept for :data:`IDLE_DRAIN` (closing it at once would
        race a request the client may be sending on it: that request would fail unanswered),
        then closed if it stayed idle."""
        self.closing = True
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        idle_until = loop.time() + min(grace, IDLE_DRAIN)
        while loop.time() < until:  # (a bounded poll, at shutdown only)
            if loop.time() >= idle_until:
                for connection in list(self.connections):
                    connection.close_when_idle()
            if not any(c.pending() or c.idle() for c in self.connections):
                break
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.abort()
        await asyncio.sleep(0)


FRESH_GRACE: Final = 1.0
"""Seconds a connection accepted just before a shutdown has to send its first head."""
IDLE_DRAIN: Final = 1.0
"""Seconds a keep-alive connection idle at a shutdown stays open for the client's next request
(answered, then closed); a client that sends none in that time is not using it."""
LINGER: Final = 2.0
"""Seconds a connection closed after its answer while the client may still be sending (a head
refused, a body refused before it ended, any answer that closes before its request's body
ended) keeps reading and dropping what comes, at most (and never past ``head_timeout``):
closed with unread bytes, the kernel resets it, and the reset can reach the client before it
read the answer (nginx's lingering close)."""


class Connection(asyncio.Protocol):
    """One client connection (see :mod:`floodwall.gateway._server`)."""

    __slots__ = (
        "_chunked",
        "_close_after",
        "_deadline",
        "_drain",
        "_handoff",
        "_head_bytes",
        "_headers",
        "_in_body",
        "_in_head",
        "_queue",
        "_raw",
        "_read_paused",
        "_ready",
        "_receiving",
        "_refused",
        "_runner",
        "_size",
        "_state",
        "_timer",
        "_two_hosts",
        "_url",
        "_waiter",
        "_write_paused",
        "born",
        "loop",
        "parser",
        "peer",
        "rules",
        "served",
        "server",
        "task",
        "transport",
    )
    """(Slots: CPython 3.11 keeps an instance's attributes inline, its fast case, only up to
    30 of them in a dict; past that every attribute read and write here costs more.)"""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.rules = server.rules
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        self.task: asyncio.Task[None] | None = None
        """The task serving the current request (``None`` between requests)."""
        self._runner: asyncio.Task[None] | None = None
        """The connection's serving task (:meth:`_serve`), between requests too."""
        self._waiter: asyncio.Future[tuple[Request, EdgeRefusal | None]] | None = None
        """What the serving task waits on between requests."""
        self._handoff: tuple[Request, EdgeRefusal | None] | None = None
        """The next request, when it came while the task was finishing the last one."""
        self._state = _IDLE
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        """Bytes received since the last complete head, but a body's (bounded by the cap)."""
        self._in_head = False
        self._in_body = False
        self._url = b""
        self._raw: list[tuple[str, str]] = []
        self._headers: dict[str, str] = {}
        self._size = 0
        """The head's fields so far: as received, by lower-case name, and their size."""
        self._two_hosts = False
        self._receiving: Request | None = None
        """The request whose body is arriving."""
        self._ready: deque[tuple[Request, EdgeRefusal | None]] = deque()
        """Heads the parser completed during the current read (served once it succeeded)."""
        self._queue: deque[tuple[Request, EdgeRefusal | None]] = deque()
        self._read_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._chunked = False
        self._close_after = False
        self._refused = False
        """Whether the edge refused a head here: the connection then closes lingering."""
        self.served = 0
        """Requests answered on this connection."""
        self.born = self.loop.time()

    # -- the transport's side ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else None
        self.server.connections.add(self)
        self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        receiving = self._receiving
        if receiving is not None and receiving.body is not None:
            receiving.body.fail(ConnectionResetError("the client closed the connection"))
        runner = self._runner
        if runner is not None and not runner.done():
            runner.cancel()  # the client went away: nobody waits for an answer
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._read_paused and self.transport is not None and not self._queue:
            self._read_paused = False
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._state == _IDLE:
            self._state = _HEAD
            self._deadline = self.loop.time() + self.server.head_timeout
            if self._timer is None:
                self._arm(self._deadline)
        in_body = self._in_body
        if not in_body:  # bytes of a head (or between requests), not of a body
            self._head_bytes += len(data)
        ready = self._ready
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._close_after = True  # an upgrade is not proxied: no byte after it is read
            self.pause_reading()
            if ready:  # (the head asking for it is the last one parsed)
                _check_upgrade(ready)
        except httptools.HttpParserError as exc:
            if not self._after_close(exc):
                ready.clear()  # (llhttp refuses some framing only once the head is complete)
                receiving = self._receiving
                if receiving is not None and receiving.body is not None:
                    receiving.body.fail(ConnectionResetError(f"malformed request body: {exc}"))
                self._refuse(parser_refusal(exc))
                return
        if in_body and self._in_head:  # a body ended and the next head began in this read:
            self._head_bytes += len(data)  # counted whole (a little more than the head: safe)
        if ready:
            self._dispatch()
        if self._head_bytes > self.rules.max_head and not self._in_body:
            quiet.debug("refusing a request head: more than %d bytes", self.rules.max_head)
            self._refuse(self.rules.too_large)

    def _after_close(self, exc: httptools.HttpParserError) -> bool:
        """Whether llhttp refused bytes that came after a whole request which closes the
        connection (``Connection: close``, HTTP/1.0): that request (and those before it) is
        served, as nginx and HAProxy do, and the bytes are never read (no 400 for it, no
        answer cut off). The connection closes after it, as its ``keep_alive`` says."""
        if self._receiving is not None or not str(exc).startswith("Data after"):
            return False  # (llhttp's HPE_CLOSED_CONNECTION: "Data after `Connection: close`")
        self.parser = _Refused()  # type: ignore[assignment]
        self._head_bytes = 0
        return True

    def _dispatch(self) -> None:
        """Serve the heads this read completed: the first now if none is being served, the
        others in turn (reading pauses while any waits)."""
        ready = self._ready
        if self.task is None:
            request, refusal = ready.popleft()
            self._start(request, refusal)
        if ready:
            self._queue.extend(ready)
            ready.clear()
            self.pause_reading()

    def eof_received(self) -> bool | None:
        receiving = self._receiving
        if receiving is not None and receiving.body is not None:
            receiving.body.fail(ConnectionResetError("the client closed the connection"))
        return None

    # -- the parser's callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._raw = []
        self._headers = {}
        self._size = 0
        self._two_hosts = False
        self._in_head = True
        if self._state == _IDLE:  # (a pipelined head: its bytes arrived with the last body)
            self._state = _HEAD
            self._deadline = self.loop.time() + self.server.head_timeout

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, field_name: bytes, field_value: bytes) -> None:
        """A field decoded as it comes (no list of the raw fields to go over again); a
        chunked body's trailer fields, which llhttp reports here too, are dropped as before."""
        if not self._in_head:
            return
        name, lower = NAMES.get(field_name) or decode_name(field_name)
        value = field_value.decode("latin-1")
        self._raw.append((name, value))
        self._size += len(name) + len(value)
        headers = self._headers
        if lower in headers:
            if lower == "host":
                self._two_hosts = True
            headers[lower] = f"{headers[lower]}, {value}"
        else:
            headers[lower] = value

    def on_headers_complete(self) -> None:
        """The request built and checked (one Python call from C per head: the size and
        edge rules applied to the fields :meth:`on_header` decoded), then left for
        :meth:`data_received` to hand on once the whole read parsed."""
        server = self.server
        parser = self.parser
        raw = self._raw
        headers = self._headers
        refusal = _TWO_HOSTS if self._two_hosts else None
        method = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        url = self._url
        request = _new_request(Request)  # (Request(...) without a class call: see _new_request)
        _init_request(request, method, url.decode("latin-1"), version, raw, headers)
        rules = self.rules = server.rules  # a reload reaches open connections' next request
        request.head_size = self._size + len(method) + len(url) + 14 + 4 * len(raw)
        request.remote = self.peer
        request.connection = self
        request.keep_alive = parser.should_keep_alive()
        if len(url) > server.max_line:
            refusal = _LONG_TARGET
        elif len(raw) > server.max_headers:
            refusal = _MANY_FIELDS
        elif self._head_bytes > server.max_field and any(
            len(n) + len(v) > server.max_field for n, v in raw
        ):
            refusal = _LONG_FIELD
        if refusal is None:
            refusal = rules.check(request)
        if refusal is not None:
            request.keep_alive = False
        self._state = _BUSY
        self._head_bytes = 0
        self._in_head = False
        if request.content_length or "transfer-encoding" in headers:
            request.body = RequestBody(self)
            self._in_body = True
        self._receiving = request
        self._ready.append((request, refusal))

    def on_body(self, body: bytes) -> None:
        receiving = self._receiving
        if receiving is not None and receiving.body is not None:
            receiving.body.feed(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        receiving = self._receiving
        if receiving is not None:
            if receiving.body is not None:
                receiving.body.feed_eof()
            self._receiving = None
        if self._state == _DRAIN:  # the answered request's body is all read away
            self._state = _BUSY
            self._next()

    # -- requests ---------------------------------------------------------------------------

    def _start(self, request: Request, refusal: EdgeRefusal | None) -> None:
        """Hand ``request`` to the connection's serving task (started with its first request)."""
        runner = self._runner
        if runner is None or runner.done():
            self.task = self._runner = self.loop.create_task(self._serve(request, refusal))
            return
        self.task = runner
        waiter = self._waiter
        if waiter is not None:  # the task waits for its next request
            self._waiter = None
            waiter.set_result((request, refusal))
        else:  # the task itself is finishing the last one (in _done): it goes on with this one
            self._handoff = (request, refusal)

    async def _serve(self, request: Request, refusal: EdgeRefusal | None) -> None:
        """The connection's one task: its requests, one after the other, waiting on a future
        between them (:meth:`_start` hands each on). One task per connection rather than per
        request: making a task (and registering it) cost about 6 k instructions per request
        more than the future. Every ambient value a request sets (its deadline, hop and call
        records, retry marker) is reset when its scope ends, so none carries over to the next
        request; nor does the last request's answer stay referenced while the connection
        idles."""
        while True:
            response: Response | None = None
            try:
                if refusal is not None:
                    quiet.debug("refusing a request (%d): %s", refusal.status, refusal.detail)
                    self._refused = True
                    response = problem_response(refusal)
                else:
                    response = await self.server.handler(request)
                if not response.sent:
                    self.send(response, request)
            except asyncio.CancelledError:
                self.abort()
                raise
            except Exception:  # a bug in a handler: answered as one, logged with its traceback
                log.exception("error serving %s %s", request.method, request.path)
                if response is None or not response.sent:
                    self.send(
                        Response(500, [("Content-Type", "text/plain")], b"500", close=True),
                        request,
                    )
                else:
                    self.abort()
            finally:
                self.task = None
                self.served += 1
                self._done(request)
            handoff = self._handoff
            if handoff is not None:
                self._handoff = None
                request, refusal = handoff
                continue
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            del request, refusal, response  # (nothing of the last request kept while idle)
            waiter = self._waiter = self.loop.create_future()
            request, refusal = await waiter

    def _done(self, request: Request) -> None:
        """After an answer: close, read the rest of the request's body away, or go on with a
        queued one (or wait for the next)."""
        transport = self.transport
        if transport is None:
            return
        if not request.keep_alive or self._close_after or self.server.closing:
            if self._refused or self._receiving is request:  # (bytes may still come: a 413
                self._linger(transport)  # before the body, an answer before its end)
            else:
                transport.close()
            return
        body = request.body
        if self._receiving is request and body is not None:  # answered before its body ended
            body.discard = True  # read the rest away (within head_timeout), then go on
            body._chunks.clear()
            self.resume_reading()
            self._state = _DRAIN
            self._deadline = self.loop.time() + self.server.head_timeout
            if self._timer is None:
                self._arm(self._deadline)
            return
        self._next()

    def _next(self) -> None:
        """The next queued request, or wait for one."""
        if self._queue:
            queued, refusal = self._queue.popleft()
            self._start(queued, refusal)
            if not self._queue:
                self.resume_reading()
            return
        self._idle()

    def _idle(self) -> None:
        if self._in_head:  # a pipelined head is arriving: it has head_timeout from now
            self._state = _HEAD
            self._deadline = self.loop.time() + self.server.head_timeout
        elif self._state == _BUSY:
            self._state = _IDLE
        if self._state == _IDLE:
            self._deadline = self.loop.time() + self.server.keepalive_timeout
        if self._timer is None:
            self._arm(self._deadline)

    def _arm(self, at: float) -> None:
        self._timer = self.loop.call_at(
            min(at, self.loop.time() + self.server.head_timeout), self._tick
        )

    def _tick(self) -> None:
        """The connection's one timer: a head or an idle spell that took too long closes it.
        It fires at least every ``head_timeout`` while it may be needed, so a deadline set
        after it was armed is never missed; it is not re-armed while a request is served."""
        self._timer = None
        if self._state == _BUSY or self.transport is None:
            return
        if self.loop.time() >= self._deadline:
            if self._state == _HEAD:
                quiet.debug("closing a connection: request head not complete in time")
            self.transport.close()
            return
        self._arm(self._deadline)

    def idle(self) -> bool:
        """Whether the connection is open between two requests (it answered one)."""
        return (
            self.transport is not None
            and self.task is None
            and self._state == _IDLE
            and self.served > 0
        )

    def close_when_idle(self) -> None:
        """Close now if idle between requests (a connection that has not sent its first head
        yet is not: it may still send one)."""
        if self.idle() and self.transport is not None:
            self.transport.close()

    def pending(self) -> bool:
        """Whether a shutdown should wait for this connection's answer."""
        if self.transport is None:
            return False
        if self.task is not None or self._state in (_HEAD, _DRAIN):
            return True
        return not self.served and self.loop.time() - self.born < FRESH_GRACE

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _refuse(self, refusal: EdgeRefusal) -> None:
        """Answer a head the parser or the size cap refused, and close (lingering, when the
        answer is this one: see :data:`LINGER`)."""
        if isinstance(self.parser, _Refused):
            return  # (refused already: later bytes are only read away)
        quiet.debug("refusing a request (%d): %s", refusal.status, refusal.detail)
        transport = self.transport
        self._state = _BUSY
        self.parser = _Refused()  # type: ignore[assignment]
        if transport is None:
            return
        if self.task is not None:
            transport.close()  # (the task's answer still to come: no byte of this one is sent)
            return
        answer = problem_response(refusal)
        length = len(answer.body)
        framing = (_LENGTHS.get(length) or _length_line(length)) + "Connection: close\r\n"
        transport.write(self._head(answer, framing, "1.1") + answer.body)
        self._linger(transport)

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after the answer written, reading away (and dropping) what the client still
        sends until it closes its side or :data:`LINGER` passes (see there); TLS, which has no
        half-close, closes at once."""
        if not transport.can_write_eof():
            transport.close()
            return
        self.parser = _Refused()  # type: ignore[assignment]
        transport.write_eof()  # the answer, then FIN
        self._state = _DRAIN  # until eof_received closes it, or the timer does
        self._deadline = self.loop.time() + min(LINGER, self.server.head_timeout)
        if self._timer is not None:
            self._timer.cancel()
        self._arm(self._deadline)
        self.resume_reading()

    # -- answers ----------------------------------------------------------------------------

    def _head(self, response: Response, framing: str, version: str) -> bytes:
        """The answer's head: status line, fields, ``Server``, ``Date``, then ``framing`` (the
        length or chunked line and the Connection line, the caller's: each knows its case)."""
        status = response.status
        reason = response.reason
        line = _STATUS_LINES.get((version, status, reason)) or _status_line(version, status, reason)
        headers = response.headers  # (C loops: str.join costs about half of "%s: %s" formats)
        fields = _lines([*map(_field, headers), ""])  # (each line ends with CRLF)
        # (No field can break its line: the upstream's were parsed by llhttp, which refuses
        # CR and LF in values; configured ones are checked when the file is read; the rest
        # are the gateway's own.)
        date = _DATE
        second = date.second
        if not second <= time.time() < second + 1:
            date.now()
        server = self.rules.server_line
        text = f"{line}{fields}{response.tail}{server}Date: {date.value}\r\n{framing}\r\n"
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            return text.encode("utf-8")

    def send(self, response: Response, request: Request) -> None:
        """Write ``response`` whole (head and body in one write)."""
        response.sent = True
        transport = self.transport
        if transport is None:
            return
        close = response.close or not request.keep_alive or self.server.closing
        if close:
            request.keep_alive = False
            framing = "Connection: close\r\n"
        else:
            framing = "Connection: keep-alive\r\n" if request.version == "1.0" else ""
        version = "1.0" if request.version == "1.0" else "1.1"
        body = response.body
        if response.status in _NO_BODY_STATUS:
            transport.write(self._head(response, framing, version))
        elif request.method == "HEAD":
            given = response.get("Content-Length") if not body else None
            length = len(body)
            if given is not None:
                response.headers = [
                    (n, v) for n, v in response.headers if n.lower() != "content-length"
                ]
                length = int(given)
            framing = (_LENGTHS.get(length) or _length_line(length)) + framing
            transport.write(self._head(response, framing, version))
        else:
            length = len(body)
            framing = (_LENGTHS.get(length) or _length_line(length)) + framing
            head = self._head(response, framing, version)
            if length < 16384:
                transport.write(head + body)
            else:
                transport.writelines((head, body))

    def begin(self, response: Response, request: Request, length: int | None) -> None:
        """Write the head of a streamed answer: ``length``, else chunked framing (HTTP/1.1)
        or the end of the connection (HTTP/1.0)."""
        response.sent = True
        transport = self.transport
        if transport is None:
            raise ConnectionResetError("the client closed the connection")
        close = response.close or not request.keep_alive or self.server.closing
        chunked = length is None and request.version == "1.1"
        if length is None and not chunked:
            close = True
        if close:
            request.keep_alive = False
        self._chunked = chunked
        if length is not None:
            framing = _LENGTHS.get(length) or _length_line(length)
        elif chunked:
            framing = "Transfer-Encoding: chunked\r\n"
        else:
            framing = ""
        if close:
            framing += "Connection: close\r\n"
        elif request.version == "1.0":
            framing += "Connection: keep-alive\r\n"
        version = "1.0" if request.version == "1.0" else "1.1"
        transport.write(self._head(response, framing, version))

    async def write(self, data: bytes, limit: float) -> None:
        """Write a piece of a streamed answer, waiting (at most ``limit`` seconds) while the
        client is slow to take it."""
        transport = self.transport
        if transport is None:
            raise ConnectionResetError("the client closed the connection")
        if self._chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)
        if self._write_paused:
            self._drain = self.loop.create_future()
            try:
                async with asyncio.timeout(limit):
                    await self._drain
            finally:
                self._drain = None

    def end(self) -> None:
        """The end of a streamed answer."""
        if self._chunked and self.transport is not None:
            self.transport.write(b"0\r\n\r\n")
        self._chunked = False

    def write_raw(self, data: bytes) -> None:
        """Bytes as they are (``100 Continue``)."""
        if self.transport is not None:
            self.transport.write(data)


class _Refused:
    """Stands in for the parser once a connection refused a head: every later byte is ignored."""

    def feed_data(self, data: bytes) -> None:
        return None


_TWO_HOSTS: Final = EdgeRefusal(400, "bad_request", "Duplicate Host header")
_LONG_TARGET: Final = EdgeRefusal(414, "request_line_too_long", "the request line is too long")
_LONG_FIELD: Final = EdgeRefusal(431, "request_field_too_large", "a request field is too long")
_MANY_FIELDS: Final = EdgeRefusal(431, "request_field_too_large", "too many request fields")
_VERSION: Final = EdgeRefusal(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1")


def _check_upgrade(ready: deque[tuple[Request, EdgeRefusal | None]]) -> None:
    """Refuse the upgrade head at the end of ``ready`` if :func:`upgrade_refusal` says so."""
    request, refusal = ready[-1]
    if refusal is None:
        refusal = upgrade_refusal(request)
        if refusal is not None:
            request.keep_alive = False
            ready[-1] = (request, refusal)


def parser_refusal(exc: Exception) -> EdgeRefusal:
    """What to answer for a request llhttp refused: 505 for a version it does not know, else
    400 with its first line (never the request bytes)."""
    said = str(exc).strip()
    if "Invalid HTTP version" in said:
        return _VERSION
    first = said.splitlines()[0].rstrip(":") if said else "malformed request"
    return EdgeRefusal(400, "bad_request", first)


def parse_head(data: bytes, server: HttpServer | None = None) -> Request:
    """``data`` (a whole request head) parsed as a connection would, without a connection: for
    tests of the edge rules."""

    class _Collect:
        def __init__(self) -> None:
            self.url = b""
            self.fields: list[tuple[bytes, bytes]] = []

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            self.fields.append((name, value))

    collect = _Collect()
    parser = httptools.HttpRequestParser(collect)
    parser.feed_data(data)
    raw = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in collect.fields]
    headers: dict[str, str] = {}
    for name, value in raw:
        lower = name.lower()
        headers[lower] = f"{headers[lower]}, {value}" if lower in headers else value
    request = Request(
        parser.get_method().decode("ascii"),
        collect.url.decode("latin-1"),
        parser.get_http_version(),
        raw,
        headers,
    )
    fields = sum(len(name) + len(value) + 4 for name, value in raw)
    request.head_size = len(request.method) + len(request.target) + 14 + fields
    return request


async def no_server_field(request: Any, response: Any) -> None:
    """An aiohttp ``on_response_prepare`` hook: no ``Server`` field (the admin listener's
    answers)."""
    response.headers.popall("Server", None)


BACKLOG: Final = 2048
"""Connections the kernel queues per listening socket before the server accepts them."""


def listen_socket(
    host: str, port: int, *, reuse_port: bool, backlog: int = BACKLOG, listen: bool = True
) -> socket.socket:
    """A listening TCP socket on ``host:port``; with ``reuse_port`` several processes bind the
    same port and the kernel spreads connections over them (``SO_REUSEPORT``, Linux ≥ 3.9).
    ``listen=False`` only binds: it reserves the port for the group without taking connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
