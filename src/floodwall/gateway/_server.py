"""The HTTP server under the proxy: aiohttp's low-level server, plus a request-head timeout.

aiohttp's protocol (llhttp parser) enforces line, header-count and field-size limits and
closes idle keep-alive connections after ``keepalive_timeout``; it has no bound on how long a
request *head* may take once it has started, which is what slowloris exploits (a byte every few
seconds keeps a connection, and a slot, forever). :class:`HeadTimeoutProtocol` adds one: from the
first byte of a request head, the whole head must arrive within ``header_timeout`` seconds, or
the connection is closed. Bodies are bounded by the proxy's per-chunk ``body_timeout``.

(The subclass uses two internals of aiohttp's ``RequestHandler``: ``_request_count``, bumped
per parsed message, and ``_handle_request``, the per-request coroutine. Should a future aiohttp
drop them, the head timeout falls back to ``keepalive_timeout``, which still bounds it.)
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["HeadTimeoutProtocol", "HeadTimeoutServer", "listen_socket"]

quiet = logging.getLogger("floodwall.gateway.protocol")
"""aiohttp logs every malformed request with a traceback; the gateway counts them instead."""


class HeadTimeoutProtocol(RequestHandler):
    """``RequestHandler`` that closes a connection whose request head is too slow."""

    _fw_head_timeout: float = 10.0
    _fw_timer: asyncio.TimerHandle | None = None
    _fw_between = True

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._fw_between = False
            self._fw_cancel()
        elif data and self._fw_between and self._fw_timer is None and self.transport is not None:
            self._fw_timer = self._loop.call_later(self._fw_head_timeout, self._fw_expire)

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

    async def _handle_request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._handle_request(*args, **kwargs)
        finally:
            self._fw_between = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self._fw_cancel()
        super().connection_lost(exc)


class HeadTimeoutServer(web.Server):
    """``aiohttp.web.Server`` whose connections use :class:`HeadTimeoutProtocol`."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        head_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.head_timeout = head_timeout

    def __call__(self) -> RequestHandler:
        protocol = HeadTimeoutProtocol(self, loop=self._loop, **self._kwargs)
        protocol._fw_head_timeout = self.head_timeout
        return protocol


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
