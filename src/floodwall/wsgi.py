"""WSGI middleware (Flask, any WSGI app): the inbound guard in front of the app.

::

    from flask import Flask
    from floodwall.wsgi import FloodwallMiddleware, RateLimit

    app = Flask(__name__)
    app.wsgi_app = FloodwallMiddleware(app.wsgi_app, limits=[RateLimit("100/s", key="ip")])

Django has an app of its own, :mod:`floodwall.django` (the same guard as Django middleware).

A :class:`~floodwall.RejectedError` the app raises (an open breaker, a full bulkhead, a timeout
deep in a handler) is answered as the guard answers its own refusals (503 with
``Retry-After``, 429, 504; problem+json). Flask answers a handler's exception itself, with a 500
page, before any WSGI middleware sees it: ``guard.register_error_handler(app)`` gives Flask the
guard's answer instead::

    app.wsgi_app = guard = FloodwallMiddleware(app.wsgi_app)
    guard.register_error_handler(app)

The same guard as the ASGI middleware (:mod:`floodwall.integrations._inbound`); handlers read the
:class:`~floodwall.integrations._inbound.Admission` as ``environ["floodwall"]`` (Flask:
``request.environ["floodwall"]``). The app runs under the request's deadline and retry marker; a
body the app streams lazily (a generator) is produced after the app returned, outside them, and
the shedding ticket is closed when the server closes the body.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from types import TracebackType
from typing import Any, Unpack
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from floodwall._core.errors import RejectedError
from floodwall.integrations._inbound import (
    Admission,
    Captured,
    GuardOptions,
    Inbound,
    InboundGuard,
    RateLimit,
    Refusal,
    by_header,
    client_ip,
    current_admission,
)
from floodwall.integrations._wire import IDEMPOTENT_REPLAYED

__all__ = [
    "Admission",
    "FloodwallMiddleware",
    "InboundGuard",
    "RateLimit",
    "by_header",
    "client_ip",
    "current_admission",
]

Environ = WSGIEnvironment
Headers = list[tuple[str, str]]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]
WSGIApp = WSGIApplication


def _inbound(environ: Environ) -> Inbound:
    headers: dict[str, str] = {}
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers[name[5:].replace("_", "-").lower()] = value
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers[name.replace("_", "-").lower()] = environ[name]
    path = environ.get("PATH_INFO") or "/"
    path = environ.get("SCRIPT_NAME", "") + path
    return Inbound(environ["REQUEST_METHOD"].upper(), path, headers, environ.get("REMOTE_ADDR"))


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _answer(
    start_response: StartResponse, status: int, headers: Headers, body: bytes
) -> list[bytes]:
    if not any(name.lower() == "content-length" for name, _ in headers):
        headers = [*headers, ("Content-Length", str(len(body)))]
    start_response(_status_line(status), headers)
    return [body]


class _Body:
    """The app's body, passed through; closing it ends the request's shedding ticket."""

    def __init__(self, inner: Iterable[bytes], admitted: Admission, status: list[int]) -> None:
        self._inner = inner
        self._admitted = admitted
        self._status = status

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._inner)

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            self._admitted.close(self._status[0] or None)


class FloodwallMiddleware:
    """Guard a WSGI app: ``FloodwallMiddleware(app, guard=None, **options)`` with
    :class:`~floodwall.integrations._inbound.InboundGuard`'s options, or a shared ``guard``."""

    def __init__(
        self, app: WSGIApp, guard: InboundGuard | None = None, **options: Unpack[GuardOptions]
    ) -> None:
        self.app = app
        self.guard = guard if guard is not None else InboundGuard(**options)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = _inbound(environ)
        admitted = self.guard.admit(request)
        if isinstance(admitted, Refusal):
            return _answer(start_response, admitted.status, admitted.headers, admitted.body)
        environ["floodwall"] = admitted
        with admitted:
            if self.guard.idempotency_key(request) is not None:
                return self._idempotent(request, admitted, environ, start_response)
            status = [0]

            def start(
                status_line: str, headers: Headers, exc_info: ExcInfo | None = None, /
            ) -> Callable[[bytes], object]:
                code = int(status_line[:3])
                status[0] = code
                return start_response(
                    status_line, headers + admitted.response_headers(code), exc_info
                )

            try:
                body = self.app(environ, start)
            except BaseException as exc:
                answer = None if status[0] else self.guard.answer_error(exc, admitted)
                if answer is None:
                    admitted.close(error=exc)
                    raise
                return _answer(start_response, answer.status, answer.headers, answer.body)
            return _Body(body, admitted, status)

    def register_error_handler(self, app: Any) -> None:
        """Answer a :class:`~floodwall.RejectedError` raised in a handler of the Flask ``app``
        as this guard does (Flask turns it into a 500 page before the middleware sees it); the
        guard's headers are added by the middleware as for any answer. Nothing is registered
        with ``answer_rejections`` off."""
        guard = self.guard
        if not guard.answer_rejections:
            return

        def answer(error: RejectedError) -> tuple[bytes, int, Headers]:
            refused = guard.rejection_answer(error)
            assert refused is not None  # a RejectedError, with answer_rejections on
            return refused.body, refused.status, refused.headers

        app.register_error_handler(RejectedError, answer)

    def _idempotent(
        self,
        request: Inbound,
        admitted: Admission,
        environ: Environ,
        start_response: StartResponse,
    ) -> list[bytes]:
        body = _read_body(environ)

        def produce() -> Captured:
            captured = Captured(500)
            environ["wsgi.input"] = io.BytesIO(body)

            def capture(
                status_line: str, headers: Headers, exc_info: ExcInfo | None = None, /
            ) -> Callable[[bytes], object]:
                captured.status = int(status_line[:3])
                captured.headers = list(headers)
                return lambda data: None

            result = self.app(environ, capture)
            try:
                captured.body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            return captured

        try:
            outcome = self.guard.idempotent(request, body, produce)
        except BaseException as exc:
            admitted.close(error=exc)
            raise
        if isinstance(outcome, Refusal):
            admitted.close(outcome.status)
            return _answer(start_response, outcome.status, outcome.headers, outcome.body)
        captured, replayed = outcome
        headers = captured.headers + admitted.response_headers(captured.status)
        if replayed:
            headers.append((IDEMPOTENT_REPLAYED, "true"))
        admitted.close(captured.status)
        return _answer(start_response, captured.status, headers, captured.body)


def _read_body(environ: Environ) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    stream = environ.get("wsgi.input")
    if stream is None or length <= 0:
        return b""
    data: bytes = stream.read(length)
    return data
