"""ASGI middleware (FastAPI, Starlette, any ASGI app): the inbound guard in front of the app.

::

    from fastapi import FastAPI
    from floodwall.asgi import FloodwallMiddleware, RateLimit

    app = FastAPI()
    app.add_middleware(
        FloodwallMiddleware,
        limits=[RateLimit("100/s", key="ip"), RateLimit("5/m", route="/login", key="ip")],
        shedder=LoadShedder(AdaptiveLimiter(Gradient2Limit())),
    )

Rejections are answered before the app runs (429/503/504 with ``Retry-After``, ``RateLimit-*``
and an ``application/problem+json`` body; 409/422 for idempotency conflicts), and so is a
floodwall rejection the app raises before it starts its answer (``answer_rejections``).
Handlers run under the request's deadline and retry marker, and read the
:class:`~floodwall.integrations._inbound.Admission` as ``request.state.floodwall``
(``scope["state"]["floodwall"]``). See :mod:`floodwall.integrations._inbound` for the rules.
Only ``http`` scopes are guarded; lifespan and websocket scopes pass through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from types import MappingProxyType
from typing import Any, Unpack

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
from floodwall.integrations._wire import _HOP, IDEMPOTENT_REPLAYED

__all__ = [
    "Admission",
    "FloodwallMiddleware",
    "InboundGuard",
    "RateLimit",
    "by_header",
    "client_ip",
    "current_admission",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


_new_inbound: Callable[[type[Inbound], tuple[str, str, Mapping[str, str], str | None]], Inbound]
_new_inbound = tuple.__new__
"""Builds an :class:`Inbound` in C, without the Python-level ``NamedTuple.__new__``."""

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
"""What a request carrying none of the wanted headers is given (most requests: nothing to
decode, no dict to build)."""


_NAMES: dict[str, bytes] = {}
"""Header names as ASGI bytes, encoded once (the guard uses a handful of names)."""


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in headers:
        raw = _NAMES.get(name)
        if raw is None:
            raw = name.lower().encode("latin-1")
            if len(_NAMES) < 256:
                _NAMES[name] = raw
        out.append((raw, value.encode("latin-1")))
    return out


async def _answer(send: Send, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    raw = _encode(headers)
    if not any(name == b"content-length" for name, _ in raw):
        raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class FloodwallMiddleware:
    """Guard an ASGI app: ``FloodwallMiddleware(app, guard=None, **options)`` where ``options``
    are :class:`~floodwall.integrations._inbound.InboundGuard`'s (``limits``, ``shedder``,
    ``idempotency``, ``registry``, ``deadline``, …) or ``guard`` is one already built (to share
    it between apps)."""

    def __init__(
        self, app: ASGIApp, guard: InboundGuard | None = None, **options: Unpack[GuardOptions]
    ) -> None:
        self.app = app
        self.guard = guard if guard is not None else InboundGuard(**options)
        wanted = self.guard.wanted_headers
        self._wanted = None if wanted is None else frozenset(n.encode() for n in wanted)

    async def __call__(  # noqa: PLR0912, PLR0915 - the per-request path, one frame on purpose
        self, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = self.guard
        wanted = self._wanted
        headers: Mapping[str, str] = _NO_HEADERS
        for raw_name, raw_value in scope["headers"]:  # only the headers the guard reads
            if wanted is not None and raw_name not in wanted:
                continue
            if headers is _NO_HEADERS:
                headers = {}
            name = raw_name.decode("latin-1")  # ASGI servers send names lower-cased
            value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value  # type: ignore[index]
        client = scope.get("client")
        request = _new_inbound(
            Inbound, (scope["method"], scope["path"], headers, client[0] if client else None)
        )
        admitted = guard.admit(request)
        if isinstance(admitted, Refusal):
            await _answer(send, admitted.status, admitted.headers, admitted.body)
            return
        state = scope.get("state")
        if state is None:
            scope["state"] = state = {}
        state["floodwall"] = admitted
        if guard.idempotency is not None and guard.idempotency_key(request) is not None:
            with admitted:
                await self._idempotent(request, admitted, scope, receive=receive, send=send)
            return
        # Admission.__enter__, __exit__ and close written out for the usual request (it brought
        # no deadline, retry marker or priority, and answers below 500): three frames less.
        plain = admitted.deadline is None and admitted.attempt is None and admitted.priority is None
        if plain:
            hop_token = _HOP.set(admitted)  # also its call record: see current_call()
        else:
            admitted.__enter__()
        try:

            def sender(message: Message) -> Awaitable[None]:
                # A plain function handing back send's awaitable: no coroutine of its own per
                # message. It records the status on the admission (for the shedding ticket; no
                # cell of its own to write) and adds headers, asking the admission only when it
                # may have some (see adds_headers).
                if message["type"] == "http.response.start":
                    code = admitted.status = message["status"]
                    if (
                        code >= 500
                        or admitted.call.degraded_by is not None
                        or admitted._guard.adds_headers
                    ):
                        extra = admitted.response_headers(code)
                        if extra:
                            message["headers"] = [*message.get("headers", ()), *_encode(extra)]
                return send(message)

            try:
                await self.app(scope, receive, sender)
            except BaseException as exc:
                answer = None if admitted.status else guard.answer_error(exc, admitted)
                if answer is None:
                    admitted.close(error=exc)
                    raise
                await _answer(send, answer.status, answer.headers, answer.body)
                return
            status = admitted.status
            ticket = admitted.ticket
            if ticket is not None and status < 500:
                ticket.success()
            else:
                admitted.close(status)
        finally:
            if plain:
                _HOP.reset(hop_token)
            else:
                admitted.__exit__(None, None, None)

    async def _idempotent(
        self, request: Inbound, admitted: Admission, scope: Scope, *, receive: Receive, send: Send
    ) -> None:
        body = await _read_body(receive)

        async def produce() -> Captured:
            captured = Captured(500)
            chunks: list[bytes] = []
            delivered = False

            async def replay() -> Message:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            async def capture(message: Message) -> None:
                if message["type"] == "http.response.start":
                    captured.status = message["status"]
                    captured.headers = [
                        (name.decode("latin-1"), value.decode("latin-1"))
                        for name, value in message.get("headers", ())
                    ]
                elif message["type"] == "http.response.body":
                    chunks.append(message.get("body", b""))

            await self.app(scope, replay, capture)
            captured.body = b"".join(chunks)
            return captured

        try:
            result = await self.guard.idempotent_async(request, body, produce)
        except BaseException as exc:
            admitted.close(error=exc)
            raise
        if isinstance(result, Refusal):
            await _answer(send, result.status, result.headers, result.body)
            admitted.close(result.status)
            return
        captured, replayed = result
        headers = captured.headers + admitted.response_headers(captured.status)
        if replayed:
            headers.append((IDEMPOTENT_REPLAYED, "true"))
        await _answer(send, captured.status, headers, captured.body)
        admitted.close(captured.status)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
