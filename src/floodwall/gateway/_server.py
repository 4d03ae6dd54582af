"""The HTTP server under the proxy: aiohttp's low-level server, plus a request-head timeout.

aiohttp's protocol (llhttp parser) enforces line, header-count and field-size limits and
closes idle keep-alive connections after ``keepalive_timeout``; it has no bound on how long a
request *head* may take once it has started, which is what slowloris exploits (a byte every few
seconds keeps a connection, and a slot, forever). :class:`HeadTimeoutProtocol` adds one: from the
first byte of a request head, the whole head must arrive within ``header_timeout`` seconds, or
the connection is closed. Bodies are bounded by the proxy's per-chunk ``body_timeout``.

The same protocol stops a head still arriving once it is past the edge rules' ``max_head``
(431), so a connection never holds more than about that much of an unfinished head; a complete
head is checked by :class:`~floodwall.gateway._edge.EdgeRules` when the request is made
(:class:`EdgeServer`). Requests the parser refuses are answered as problem documents (505 for an
unsupported version, 414 and 431 for an oversized line or field, 400 otherwise) and logged at
debug level in one line, without a traceback; every answer's ``Server`` field is the
configuration's (none by default), the parser's refusals included.

(The subclass uses internals of aiohttp's ``RequestHandler``: ``_request_count``, bumped per
parsed message, ``_messages`` and ``_request_in_progress``, and ``_handle_request``, the
per-request coroutine. Should a future aiohttp drop them, the head timeout falls back to
``keepalive_timeout``, which still bounds it, and the head cap to ``max_headers × max_line``.
The ``Server`` field is set in ``BaseRequest._prepare_hook``, which aiohttp calls for every
answer between preparing its fields and writing them.)
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import BadStatusLine, HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import ERROR, RequestHandler

from floodwall.gateway._edge import EdgeRefusal, EdgeRules
from floodwall.integrations._wire import PROBLEM_JSON, problem

__all__ = [
    "EdgeRequest",
    "EdgeServer",
    "HeadTimeoutProtocol",
    "listen_socket",
    "no_server_field",
    "parser_refusal",
]

quiet = logging.getLogger("floodwall.gateway.protocol")
"""aiohttp logs every malformed request with a traceback; the gateway counts them instead."""


class HeadTimeoutProtocol(RequestHandler):
    """``RequestHandler`` that closes a connection whose request head is too slow."""

    _fw_head_timeout: float = 10.0
    _fw_rules: EdgeRules | None = None
    _fw_timer: asyncio.TimerHandle | None = None
    _fw_between = True
    _fw_head_bytes = 0
    """Bytes received since the head now arriving began (while no head is complete)."""
    _fw_body: StreamReader | None = None
    """The last request's body: until it is all in, bytes are body, not a new head (aiohttp
    reads away a body its handler left unread)."""

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._fw_between = False
            self._fw_head_bytes = 0
            self._fw_cancel()
        elif data and self._fw_between and self.transport is not None:
            body = self._fw_body
            if body is not None and not body.is_eof():
                return
            self._fw_head_bytes += len(data)
            rules = self._fw_rules
            over = rules is not None and self._fw_head_bytes > rules.max_head
            if over and rules is not None and self._fw_refuse_head(rules):
                return
            if self._fw_timer is None:
                self._fw_timer = self._loop.call_later(self._fw_head_timeout, self._fw_expire)

    def _fw_refuse_head(self, rules: EdgeRules) -> bool:
        """A head still arriving past ``max_head``: 431 and close, before it grows further
        (unless an answer is still due: the parser's own limits bound the head meanwhile)."""
        if self._messages or self._request_in_progress or self.transport is None:
            return False
        quiet.debug("refusing a request head: more than %d bytes", rules.max_head)
        self.transport.write(_raw_answer(rules.too_large, rules.server_header))
        self.force_close()
        return True

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The parser's refusals as problem documents, logged in one line (no traceback);
        anything else (a handler that failed) as aiohttp answers it, logged with its
        traceback: that one is a bug."""
        if not isinstance(exc, HttpProcessingError) or status == 500:
            return super().handle_error(request, status, exc, message)
        refused = parser_refusal(exc)
        quiet.debug("refusing a request (%d): %s", refused.status, refused.detail)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was already sent: no room for the refusal")
        return answer(refused)

    def _fw_cancel(self) -> None:
        timer = self._fw_timer
        if timer is not None:
            timer.cancel()
            self._fw_timer = None

    def _fw_expire(self) -> None:
        self._fw_timer = None
        if self._fw_between and not self._messages and not self._request_in_progress:
            quiet.debug("closing a connection: request head not complete in time")
            self.force_close()

    async def _handle_request(self, request: web.BaseRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._handle_request(request, *args, **kwargs)
        finally:
            self._fw_between = True
            self._fw_head_bytes = 0
            self._fw_body = request.content

    def connection_lost(self, exc: BaseException | None) -> None:
        self._fw_cancel()
        super().connection_lost(exc)


class EdgeRequest(web.BaseRequest):
    """A request that carries its edge verdict and writes the configured ``Server`` field."""

    ATTRS = web.BaseRequest.ATTRS | frozenset(["refusal", "server_header"])
    refusal: EdgeRefusal | None = None
    server_header: str | None = None

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        server = self.server_header
        if server is None:
            response.headers.popall("Server", None)
        else:
            response.headers["Server"] = server


class EdgeServer(web.Server):
    """``aiohttp.web.Server`` with the head timeout (:class:`HeadTimeoutProtocol`) and the
    edge rules in front of ``handler``; assign :attr:`rules` to change them (a reload)."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        head_timeout: float,
        rules: EdgeRules,
        **kwargs: Any,
    ) -> None:
        super().__init__(self._serve, request_factory=self._request, **kwargs)
        self.head_timeout = head_timeout
        self.rules = rules
        self._handler = handler

    def __call__(self) -> RequestHandler:
        protocol = HeadTimeoutProtocol(self, loop=self._loop, **self._kwargs)
        protocol._fw_head_timeout = self.head_timeout
        protocol._fw_rules = self.rules
        return protocol

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> EdgeRequest:
        rules = self.rules
        if isinstance(protocol, HeadTimeoutProtocol):
            protocol._fw_rules = rules  # a reload reaches open connections' next head
        refusal = None
        host = None
        if message is ERROR:  # the parser refused it: handle_error answers, in HTTP/1.1
            message = _ERROR_11
        else:
            refusal = rules.check(message)
            if refusal is not None and refusal.version_error:
                message = message._replace(version=HttpVersion11, should_close=True)
            elif refusal is None and message.path[:1] != "/" and message.url.absolute:
                host = message.url.raw_authority  # RFC 9112 §3.2.2: the target's wins
        request = EdgeRequest(message, payload, protocol, writer, task, self._loop, host=host)
        if refusal is not None:  # (the defaults are class attributes: no writes per request)
            request.refusal = refusal
        if rules.server_header is not None:
            request.server_header = rules.server_header
        return request

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        refusal = request.refusal if isinstance(request, EdgeRequest) else None
        if refusal is not None:
            quiet.debug("refusing a request (%d): %s", refusal.status, refusal.detail)
            return answer(refusal)
        return await self._handler(request)


_ERROR_11 = ERROR._replace(version=HttpVersion11)
"""aiohttp's stand-in for a request it could not parse, answered in HTTP/1.1 (not 1.0)."""


async def no_server_field(request: web.Request, response: web.StreamResponse) -> None:
    """An ``on_response_prepare`` hook: no ``Server`` field (the admin listener's answers)."""
    response.headers.popall("Server", None)


def answer(refusal: EdgeRefusal) -> web.Response:
    """The problem document for ``refusal``; the connection closes after it."""
    response = web.Response(
        status=refusal.status, body=problem(refusal.status, refusal.kind, refusal.detail)
    )
    response.headers["Content-Type"] = PROBLEM_JSON
    response.force_close()
    return response


def parser_refusal(exc: HttpProcessingError) -> EdgeRefusal:
    """What to answer for a request the parser refused: 505 for a well-formed version other
    than 1.x, 414 for a long request line, 431 for a long field or too many fields, else 400.
    The detail is the parser's first line, never the request bytes it quotes."""
    said = (exc.message or "").strip()
    if isinstance(exc, BadStatusLine) and "Invalid HTTP version" in said:
        return EdgeRefusal(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1")
    if isinstance(exc, LineTooLong):
        said_line = exc.args[0] if exc.args else b""
        line = bytes(said_line) if isinstance(said_line, bytes | bytearray) else b""
        if line.startswith((b"/", b"*")) or b"://" in line[:16]:  # the target, not a field
            return EdgeRefusal(414, "request_line_too_long", "the request line is too long")
        return EdgeRefusal(431, "request_field_too_large", "a request field is too long")
    if said.startswith("Too many headers"):
        return EdgeRefusal(431, "request_field_too_large", "too many request fields")
    first = said.splitlines()[0].rstrip(":") if said else "malformed request"
    return EdgeRefusal(400, "bad_request", first)


def _raw_answer(refusal: EdgeRefusal, server: str | None) -> bytes:
    """``refusal`` as bytes, for a protocol that answers before any request exists."""
    body = problem(refusal.status, refusal.kind, refusal.detail)
    reason = HTTPStatus(refusal.status).phrase
    lines = [
        f"HTTP/1.1 {refusal.status} {reason}",
        f"Content-Type: {PROBLEM_JSON}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if server is not None:
        lines.append(f"Server: {server}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def listen_socket(
    host: str, port: int, *, reuse_port: bool, backlog: int = 2048, listen: bool = True
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
