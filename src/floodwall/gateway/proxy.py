"""The reverse proxy: one request in, one protected upstream exchange, one answer out.

:meth:`Proxy.handle` is the request handler of the gateway's HTTP server. Its steps, each
answering on its own when it refuses:

1. **hygiene**: ``CONNECT`` and ``TRACE`` are refused (405: no tunnels, no open proxy); an
   HTTP/1.0 request with ``Transfer-Encoding`` is refused (RFC 9112 §6.1: faulty framing), a
   coding other than ``chunked`` is a 501; ``Expect`` in HTTP/1.0 is ignored (RFC 9110
   §10.1.1), another than ``100-continue`` is a 417; a path with dot-segments, empty
   segments, encoded separators or a broken ``%`` escape is refused (400). The HTTP parser
   (llhttp, strict) has already refused conflicting ``Content-Length`` /
   ``Transfer-Encoding``, repeated ``Content-Length``, obfuscated ``Transfer-Encoding``, bare
   LF, whitespace before colons and oversized lines and headers.
2. **routing**: host (the ``Host`` header, or the authority of an absolute-form target),
   path, method and headers pick a route; none matches → 404. The upstream address always
   comes from the configuration, never from the request.
3. **limits**: a declared body over ``limits.max_body`` → 413 before a byte is read.
4. the route's **guard**, **rate limit**, **resource pipeline**, **fallbacks**
   (:mod:`floodwall.gateway.policies`).
5. **forwarding**: hop-by-hop fields dropped both ways, ``Forwarded``/``X-Forwarded-*`` and
   the request id written (:mod:`floodwall.gateway._headers`), the deadline and retry marker
   sent as the integrations do (``X-Request-Deadline`` is the time left minus 10 ms).
   Request bodies up to ``retry_body_limit`` are buffered (so a retry can resend them),
   larger ones stream through once; answers stream back, small ones in one write.

Every try reports its outcome to the upstream pool (outlier detection, the endpoint's figures):
its status, or the gateway failure that ended it (timeout, connect, reset, protocol), including
a try the resource's Timeout cancelled, and then how the body of an answer below 500 ended (a
body that stalls past ``read_timeout`` or breaks is the endpoint's failure too; a run of
failures ends only with a whole body: :func:`_body_ended`). A retry goes to an endpoint the
request has not tried while there is one, and a try that failed at the gateway goes on to such
an endpoint with what is left of the deadline when the retry held back only for lack of time
(:func:`_try_elsewhere`).

Slow clients: a request head must arrive within ``limits.header_timeout`` (the server's
protocol closes the connection otherwise), each chunk of a body within
``limits.body_timeout`` (408), and each chunk of the answer must be taken within
``limits.write_timeout`` (the connection is closed).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Final

from floodwall._core import meter as _meter
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import LimitStoreUnavailableError, RateLimitedError, RejectedError
from floodwall.context import Deadline, remaining, retry_marker
from floodwall.gateway._client import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamResponse,
)
from floodwall.gateway._headers import (
    REQUEST_DROPPED,
    RESPONSE_DROPPED,
    client_address,
    connection_tokens,
    forwarding_headers,
    new_request_id,
    valid_request_id,
)
from floodwall.gateway._server import Request, Response
from floodwall.gateway.config import ClientLimits, ProxyConfig
from floodwall.gateway.fallbacks import (
    DEGRADED_HEADER,
    Answer,
    cache_key,
    cacheable_request,
    cacheable_response,
    degraded_value,
)
from floodwall.gateway.policies import Route, client_ip_key, rejection_outcome
from floodwall.gateway.routing import Router, normalise_host, unsafe_path
from floodwall.gateway.upstream import Endpoint, UpstreamPool
from floodwall.integrations._inbound import Admission, Inbound, Refusal, refusal
from floodwall.integrations._outbound import MIN_ATTEMPT_TIMEOUT, Call, Outbound
from floodwall.integrations._wire import PROBLEM_JSON, problem
from floodwall.ratelimit._base import INF, Decision, StoreDownDecision
from floodwall.ratelimit.headers import rate_limit_headers
from floodwall.retry import gave_up

# Assigned, not imported by name: CPython 3.11 calls a method of an import-bound name through
# a bound method made per call (docs/gateway.md, "A fifth pass").
DEGRADED = _meter.DEGRADED

__all__ = ["Proxy", "Table", "UpstreamUnavailableError"]

log = logging.getLogger("floodwall.gateway")

SMALL_BODY: Final = 64 * 1024
"""Answers up to this size (declared) are read whole and sent in one write."""
_NO_BODY_METHODS: Final = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_CONNECT_ERRORS = (UpstreamConnectError,)
_IO_ERRORS = (UpstreamError,)
"""(After the connect errors, which are a kind of upstream error.)"""
_FAILURES = (TimeoutError, ConnectionError, *_CONNECT_ERRORS, *_IO_ERRORS)
"""What a failed exchange may raise once the pipeline gave up: the client's errors, and plain
``ConnectionError`` (a ``chaos`` section's injected fault stands for the dependency failing)."""
UNRETRYABLE_LEAD: Final = 0.001
"""Seconds before the resource's per-try timeout that a try which may not be repeated ends."""
CLIENT_DEADLINE_SLACK: Final = 0.001
"""Seconds by which a client's deadline must undercut the route's to count as the client's."""
MIN_TRY_TIME: Final = 0.01
"""Seconds of the request's deadline a try on another endpoint needs at least."""
_STATUS_OF: Final = {"upstream_5xx": 502}
"""Statuses of gateway rejections the integrations' table does not know (a missing endpoint
is a 503 like any rejection; an unreachable one, not a rejection, is a 502)."""


class UpstreamUnavailableError(RejectedError):
    """No endpoint of the upstream may take a request (all unhealthy or ejected)."""

    kind = "upstream_unavailable"


class _BodyError(Exception):
    """A request body broke a limit: ``status`` (413 or 408) says which."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


@dataclass(frozen=True, slots=True)
class Table:
    """Everything one configuration gives the proxy; swapped whole on reload."""

    router: Router[Route]
    limits: ClientLimits
    proxy: ProxyConfig
    trusted: Callable[[str | None], bool]
    request_id: str
    """The request id header's name."""
    request_id_lower: str = field(init=False)
    # The settings read per request, as plain attributes: the configuration's models are
    # pydantic's, whose ``__getattr__`` makes every attribute read a slow lookup.
    max_body: int = field(init=False)
    body_timeout: float = field(init=False)
    via: bool = field(init=False)
    error_body_limit: int = field(init=False)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "request_id_lower", self.request_id.lower())
        setattr_(self, "max_body", self.limits.max_body)
        setattr_(self, "body_timeout", self.limits.body_timeout)
        setattr_(self, "via", self.proxy.via)
        setattr_(self, "error_body_limit", self.proxy.error_body_limit)


class _Body:
    """A request body streamed upstream once, under the size and idle-time limits."""

    __slots__ = ("error", "idle", "limit", "request", "started")

    def __init__(self, request: Request, limit: int, idle: float) -> None:
        self.request = request
        self.limit = limit
        self.idle = idle
        self.started = False
        self.error: _BodyError | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        self.started = True
        received = 0
        content = self.request.body
        assert content is not None
        while True:
            try:
                async with asyncio.timeout(self.idle):
                    chunk = await content.readany()
            except TimeoutError:
                self.error = _BodyError(408, f"no request body byte within {self.idle:g}s")
                raise self.error from None
            if not chunk:
                return
            received += len(chunk)
            if received > self.limit:
                self.error = _BodyError(413, f"request body larger than {self.limit} bytes")
                raise self.error
            yield chunk


async def _read_body(request: Request, limit: int, idle: float) -> bytes:
    body = _Body(request, limit, idle)
    return b"".join([chunk async for chunk in body.chunks()])


class _Attempt:
    """The request as it goes upstream (the same for every try; a backup copies it) and its
    tries on a pool: the function the pipeline calls (and retries). Picks an endpoint the
    request has not tried yet (while there is one), bounds the wait for the answer's head,
    reports every outcome to the pool (outlier detection and the endpoint's figures), and
    raises the failures the pipeline must see. (One object for both: a second one, its
    ``__init__`` and the tuple handing both back cost about 1 k instructions per request.)"""

    __slots__ = (
        "body",
        "bounded",
        "call",
        "client_deadline",
        "client_host",
        "error_limit",
        "failed",
        "fixed",
        "forwarded_host",
        "head_in_try",
        "headers",
        "method",
        "path_qs",
        "pool",
        "tried",
    )

    def __init__(  # noqa: PLR0917 - built per request: positional arguments cost less
        self,
        pool: UpstreamPool,
        call: Call,
        method: str,
        path_qs: str,
        headers: list[tuple[str, str]],
        body: bytes | _Body | None,
        fixed: str,
        forwarded_host: str,
        client_deadline: Deadline | None,
        try_timeout: float | None,
        error_limit: int,
    ) -> None:
        self.pool = pool
        self.call = call
        self.method = method
        self.path_qs = path_qs
        self.headers = headers
        """The fields sent upstream but ``fixed``'s."""
        self.body = body
        self.fixed = fixed
        """This hop's forwarding fields as head lines (made once per peer and host, checked
        for CR and LF when they were made), written after :attr:`headers`."""
        self.forwarded_host = forwarded_host
        """The ``X-Forwarded-Host`` sent (the client's host, for ``host_header: client``)."""
        self.client_deadline = client_deadline
        """The request's deadline when the client chose it shorter than the route's own: a
        try it ends is not held against the endpoint (else any client could eject endpoints
        by sending tiny deadlines)."""
        self.bounded = try_timeout is not None
        """Whether the resource's Timeout bounds each try (else the deadline does, here)."""
        # (max(try_timeout, MIN_ATTEMPT_TIMEOUT) <= read_timeout, without max(): a builtin
        # called through a tuple of its arguments, about 0.9 k instructions per request)
        read_timeout = pool.read_timeout
        self.head_in_try = (
            try_timeout is not None
            and try_timeout <= read_timeout
            and read_timeout >= MIN_ATTEMPT_TIMEOUT
        )
        """Whether the Timeout's ``try_timeout`` ends every try before ``read_timeout`` could:
        then a try that may be repeated needs no clock read for its head's limit."""
        self.error_limit = error_limit
        self.tried: list[Endpoint] = []
        self.failed: bool | None = None
        """After a try that ended in a gateway failure (timeout, connect, reset): whether it
        may be sent again (``None``: the last try did not fail that way)."""
        self.client_host = forwarded_host if pool.client_host else None

    async def __call__(self) -> UpstreamResponse:  # noqa: PLR0912 - one try inline
        pool, call = self.pool, self.call
        self.failed = None
        endpoint = pool.sole  # (a pool of one: no UpstreamPool.pick call)
        if endpoint is None:
            endpoint = pool.pick(self.tried)
        if endpoint is None:
            raise UpstreamUnavailableError(
                pool.name, f"no available endpoint in upstream {pool.name!r}", None
            )
        body = self.body
        data: bytes | AsyncIterator[bytes] | None
        if isinstance(body, _Body):
            if body.started:
                error = ConnectionError("the streamed request body was already sent")
                raise call.io_error(error)
            data = body.chunks()
        else:
            data = body
        self.tried.append(endpoint)
        client_host = self.client_host
        host = endpoint.host_field if client_host is None else ("Host", client_host)
        headers = [*self.headers, host, *call.headers()]
        client = pool.client
        assert client is not None
        limit = None if self.head_in_try and call.retryable else self._head_limit()
        endpoint.in_flight += 1
        try:
            if limit is None:
                answer = await client.request(
                    endpoint.origin, self.method, self.path_qs, headers, data, fixed=self.fixed
                )
            else:
                async with asyncio.timeout(limit):
                    answer = await client.request(
                        endpoint.origin, self.method, self.path_qs, headers, data, fixed=self.fixed
                    )
        except BaseException as exc:  # noqa: BLE001 - every ending is mapped, then raised
            raise self._failed(endpoint, exc) from None
        if not answer.complete and call.retryable:
            await self._small_body(answer, endpoint)
        status = answer.status
        # (UpstreamPool.report of an answer below 500 after another, inline: the usual answer,
        # no call; after failures, one whose body is still coming ends their run only once the
        # body is whole: _body_ended)
        if status < 500 and not (endpoint.streak and answer.complete):
            endpoint.requests += 1
        else:
            pool.report(endpoint, status)
        failure = call.check(status, answer.header, None)
        if failure is None:
            answer.endpoint = endpoint
            return answer
        try:
            failure.answer = await _buffered(answer, self.error_limit)
        finally:
            endpoint.in_flight -= 1
        raise failure

    async def _small_body(self, answer: UpstreamResponse, endpoint: Endpoint) -> None:
        """A small answer's body (up to :data:`SMALL_BODY`, declared), awaited within the try
        that may be sent again: nothing went to the client yet, so a body that stalls past
        ``read_timeout`` or breaks fails the try like a missing head, and a retry may send the
        request to another endpoint. (A try that may not be repeated leaves it to
        :meth:`Proxy._whole`.)"""
        length = answer.content_length
        if length is None or length > SMALL_BODY:
            return
        try:
            async with asyncio.timeout(self.pool.read_timeout):
                await answer.arrived()
        except BaseException as exc:  # noqa: BLE001 - every ending is mapped, then raised
            answer.release()
            raise self._failed(endpoint, exc) from None

    def _head_limit(self) -> float | None:
        """Seconds the answer's head may take: ``read_timeout`` and the time this try has
        left; ``None`` when the resource's Timeout ends the try sooner. Unless the request may
        not be sent again: the Timeout's error is one its retry takes as transient whatever the
        method, so such a try ends :data:`UNRETRYABLE_LEAD` earlier, on a timer of its own,
        with an error the retry leaves alone."""
        call = self.call
        if self.head_in_try and call.retryable:
            return None  # (what the lines below find, without reading the deadline; the
            # caller tests this first: no call for it per try)
        limit: float = self.pool.read_timeout
        left = call.attempt_timeout()
        if left is None or left > limit:
            return limit
        if not self.bounded:
            return left
        return None if call.retryable else max(0.0, left - UNRETRYABLE_LEAD)

    def _failed(self, endpoint: Endpoint, exc: BaseException) -> BaseException:
        """What to raise for a try that ended in ``exc``, counted against ``endpoint`` when
        the endpoint is to blame (not the client's deadline, body, or departure)."""
        call = self.call
        if isinstance(exc, _CONNECT_ERRORS):
            self.failed = True  # nothing reached the upstream: any request may go again
            return self._gateway_failure(endpoint, "connect", call.connect_error(exc))
        endpoint.in_flight -= 1
        if isinstance(exc, TimeoutError):
            if not self._client_ended():
                self._count(endpoint, "timeout")
            return call.timeout_error(exc)
        if isinstance(exc, _IO_ERRORS):
            body = self.body
            if isinstance(body, _Body) and body.error is not None:
                return body.error  # the client's body broke a limit, not the upstream
            self._count(endpoint, _broke(exc))
            return call.io_error(exc)
        if (  # the per-try or route timeout (else the client went away, or the gateway stops)
            isinstance(exc, asyncio.CancelledError)
            and _past_deadline()
            and not self._client_ended()
        ):
            self._count(endpoint, "timeout")
        return exc

    def _gateway_failure(
        self, endpoint: Endpoint, reason: str, error: BaseException
    ) -> BaseException:
        endpoint.in_flight -= 1
        self._count(endpoint, reason)
        return error

    def _client_ended(self) -> bool:
        """Whether the deadline the client chose (shorter than the route's) ended the try."""
        shortened = self.client_deadline
        return shortened is not None and shortened.remaining() <= CLIENT_DEADLINE_SLACK

    def _count(self, endpoint: Endpoint, reason: str) -> None:
        self.pool.report(endpoint, None, reason)
        if self.failed is None:
            self.failed = self.call.retryable and not _sent_once(self)


_new = object.__new__
_init_attempt = _Attempt.__init__
_init_call = Call.__init__
_init_response = Response.__init__
"""The objects every request makes, built in two calls from Python: on CPython 3.11 a class
call with a Python ``__init__`` re-enters the interpreter from C (as the inbound guard builds
its ``Admission``)."""


def _broke(exc: BaseException) -> str:
    """The failure reason of an exchange that ``exc`` (the upstream client's error, or a
    timer's) ended after the request went out."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "protocol" if isinstance(exc, UpstreamProtocolError) else "reset"


def _body_ended(
    pool: UpstreamPool, upstream: UpstreamResponse, error: BaseException | None
) -> None:
    """How the body of an answer below 500 ended, for its endpoint: ``error`` (a stalled or
    broken body is the endpoint's failure like a missing head), else whole (it ends the
    endpoint's run of failures, if the head left one open)."""
    endpoint: Endpoint = upstream.endpoint
    if error is not None:
        if upstream.status < 500:  # (a 5xx was counted when its head came)
            pool.report(endpoint, None, _broke(error), counted=True)
    elif endpoint.streak and upstream.status < 500:
        pool.report(endpoint, upstream.status, counted=True)


def _past_deadline() -> bool:
    """Whether the deadline the running try was given (the resource's Timeout, inside the
    request's) has passed: a cancellation then is that timeout, not the client leaving."""
    left = remaining()
    return left is not None and left <= 0


def _client_deadline(admitted: Admission, route_timeout: float | None) -> Deadline | None:
    """The request's deadline if the client's ``X-Request-Deadline`` made it shorter than the
    route's ``timeout`` (read as the request is admitted), else ``None``."""
    shortened = admitted.deadline
    if shortened is None or route_timeout is None:
        return shortened
    return shortened if shortened.remaining() < route_timeout - CLIENT_DEADLINE_SLACK else None


def _sent_once(out: _Attempt) -> bool:
    """Whether the request's body streamed upstream and cannot be sent again."""
    body = out.body
    return isinstance(body, _Body) and body.started


class Proxy:
    """The gateway's request handler over the current :class:`Table` (see the module)."""

    def __init__(self, table: Table, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.table = table
        self.clock = clock
        self.outbound = Outbound(clock=clock)
        self.in_flight = 0
        self.requests = 0
        self._hosts: dict[str, str] = {}
        """``Host`` values as received -> normalised (they repeat; bounded by HOSTS_KEPT)."""

    # -- the handler ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:  # noqa: PLR0912, PLR0915 - one coroutine
        """The answer to ``request``: refused by :meth:`_route`, or the route's guard, rate
        limit and protected exchange, the answer tagged with the request id and the guard's
        and rate limit's fields. (One coroutine from the route on: a coroutine layer per
        request costs about 1.5 k instructions.)"""
        table = self.table
        self.requests += 1
        found = self._route(request, table)
        if isinstance(found, Response):
            return found
        route, params = found
        stats = route.stats
        stats.requests += 1
        stats.in_flight += 1
        self.in_flight += 1
        now = self.clock.monotonic
        start = now()
        response: Response | None = None  # (set as the handler returns: the figures' status)
        try:
            headers = request.headers
            peer = request.remote
            trusted = table.trusted(peer)
            reads = route.guard_reads
            plain = route.reads.isdisjoint(headers)  # (then no field below is looked up)
            if plain:
                rid = None
                shown = _NO_HEADERS if reads is not None else headers
            else:
                rid = headers.get(table.request_id_lower)
                shown = headers if reads is None or not reads.isdisjoint(headers) else _NO_HEADERS
            if rid is None or not (trusted and valid_request_id(rid)):
                rid = new_request_id()
            client = client_address(peer, headers, table.trusted) if trusted else peer
            admitted = route.guard.admit(_inbound((request.method, request.path, shown, peer)))
            if isinstance(admitted, Refusal):
                stats.count(admitted.error.kind)
                stats.settle(rejection_outcome(admitted.error), "error")
                response = _with(_refused(admitted), table.request_id, rid, ())
                return response
            status: int | None = None
            try:
                shortened = (  # (a deadline only a client's header can have made shorter)
                    _client_deadline(admitted, route.timeout)
                    if not plain and ("x-request-deadline" in headers or "grpc-timeout" in headers)
                    else None
                )
                extra: Sequence[tuple[str, str]] = ()
                block = ""
                limiter = route.limiter
                if limiter is not None:
                    key_of = route.key  # (Route.rate_key, inline; client_ip without a call)
                    key: Hashable
                    if key_of is client_ip_key:
                        key = client
                    else:
                        key = None if key_of is None else key_of(client, headers, params)
                    if route.global_limit:
                        decision: Decision = await limiter.acquire_async(key)  # type: ignore[union-attr]
                    else:
                        decision = limiter.acquire(key)
                    if not decision[0]:
                        response = _rate_refused(route, decision, table.request_id, rid)
                        return response
                    extra, block = route.rate_fields(decision)
                expect = None if plain else headers.get("expect")
                if expect is not None and request.version != "1.0":  # (1.0: ignored, RFC 9110
                    if expect.lower() != "100-continue":  # §10.1.1)
                        why = f"Expect: {expect} is not supported"
                        refused = _problem(417, "expectation_failed", why)
                        response = _with(refused, table.request_id, rid)
                        return response
                    # a 100 for any declared body, Content-Length: 0 too (nginx's and HAProxy's)
                    declared = request.body is not None or request.content_length is not None
                    if declared and request.connection is not None:
                        request.connection.write_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
                try:
                    # `with admitted`, written out: __enter__ and __exit__ called from here run
                    # in this frame's interpreter, not in a new one entered from C
                    admitted.__enter__()
                    try:
                        answer = await self._exchange(
                            request, table, route, rid, client, trusted, shortened, plain
                        )
                    finally:
                        admitted.__exit__(None, None, None)
                except _BodyError as error:
                    answer = _problem(error.status, "request_body", str(error), close=True)
                status = answer.status
                guard_fields = admitted.response_headers(status)
                if answer.clean and not guard_fields:  # (the usual answer: lines made once)
                    answer.tail = f"{block}{table.request_id}: {rid}\r\n"
                else:  # the route's fields, the guard's and the request id
                    _with(answer, table.request_id, rid, [*extra, *guard_fields])
                if isinstance(answer, _Streaming):
                    await answer.stream(request)
                response = answer
                return response
            finally:
                admitted.close(status)
        finally:
            stats.in_flight -= 1
            self.in_flight -= 1
            stats.done(response.status if response is not None else 0, now() - start)

    def _route(self, request: Request, table: Table) -> Response | tuple[Route, dict[str, str]]:
        """The route of ``request`` and its path's parameters, or the refusal of a request
        that breaks the hygiene rules, matches no route or declares too large a body."""
        method = request.method
        if method in ("CONNECT", "TRACE"):
            return _problem(405, "method_not_allowed", f"{method} is not proxied", close=True)
        headers = request.headers
        if "transfer-encoding" in headers:
            refused = _framing_error(request.version, headers["transfer-encoding"])
            if refused is not None:
                return refused
        path = request.path
        why = unsafe_path(path, request.raw_path)
        if why is not None:
            return _problem(400, "bad_path", why)
        host = self._hosts.get(request.host)
        if host is None:
            host = normalise_host(request.host)
            if len(self._hosts) >= HOSTS_KEPT:
                self._hosts.clear()
            self._hosts[request.host] = host
        found = table.router.match(method, host, path, headers)
        if found is None:
            return _problem(404, "no_route", "no route for this host and path")
        length = request.content_length
        if length is not None and length > table.max_body:
            return _problem(
                413, "body_too_large", f"body larger than {table.max_body} bytes", close=True
            )
        return found

    # -- the protected exchange ----------------------------------------------------------------

    async def _exchange(  # noqa: PLR0912, PLR0915, PLR0917 - the first pass inline; positional
        self,
        request: Request,
        table: Table,
        route: Route,
        rid: str,
        client: str | None,
        trusted: bool,
        shortened: Deadline | None,
        plain: bool,
    ) -> Response:
        """The protected exchange of ``request`` and its answer (``plain``: the request has none
        of the fields :attr:`Route.reads` names)."""
        path_qs = request.path_qs
        if route.strip is not None:
            path_qs = _strip(path_qs, route.strip)
        fields, fixed, forwarded_host = _upstream_headers(
            request, rid, trusted, client, table, plain
        )
        method = request.method
        body: bytes | _Body | None = None
        if request.body is not None:  # buffered (a retry can resend it) or streamed once
            length = request.content_length
            if length is not None and length <= route.retry_body_limit:
                body = await _read_body(request, table.max_body, table.body_timeout)
            else:
                body = _Body(request, table.max_body, table.body_timeout)
                if length is not None:
                    fields.append(("Content-Length", str(length)))
        degraded_before = DEGRADED.get()
        policy = route.resource
        pool = route.pool
        # (the call and its tries built here, each without a class call: see _new)
        call = _new(Call)
        key = None if plain else request.headers.get("idempotency-key")
        _init_call(call, self.outbound, method, pool.name, policy, key)
        if body is not None and isinstance(body, _Body):
            call.retryable = False  # streamed once: nothing to resend
        call.record = route.call_record
        per_try = getattr(policy, "timeout", None)
        attempt = _new(_Attempt)
        _init_attempt(
            attempt,
            pool,
            call,
            method,
            path_qs,
            fields,
            body,
            fixed,
            forwarded_host,
            shortened,
            per_try.seconds if per_try is not None else None,
            table.error_body_limit,
        )
        try:
            try:  # (the first pass awaited here: no coroutine of its own per request)
                result = await call.run_async(attempt)
            except Exception as error:  # noqa: BLE001 - raised again unless tried elsewhere
                result = await self._elsewhere(error, call, attempt, policy)
        except RejectedError as error:
            outcome = rejection_outcome(error)
            if error.kind in {"rate_limited", "store_unavailable"}:  # the limit's, not upstream's
                route.stats.count(error.kind)
                route.stats.settle(outcome, "error")
                return _refused(refusal(error))
            return await self._failed(request, route, attempt, error.kind, outcome, error=error)
        except _FAILURES as error:
            body = attempt.body
            if isinstance(body, _Body) and body.error is not None:
                raise body.error from None
            timeout = isinstance(error, TimeoutError)
            kind = "timeout" if timeout else "upstream_unavailable"
            outcome = "timeout" if timeout else "error"
            return await self._failed(request, route, attempt, kind, outcome, error=error)
        if isinstance(result, UpstreamResponse):
            live = self._live(request, route, result, table)
            if live is None:
                live = await self._whole(request, route, result, table)
            return live
        if isinstance(result, Answer):
            if result.status >= 500:
                return await self._failed(
                    request, route, attempt, "upstream_5xx", "error", answer=result
                )
            route.stats.settle("error", "error")  # a 408/425/429 the retry gave up on
            return _answer(result)
        # The resource's own fallback answered with a value: it goes out as JSON. What the
        # dependency did is in the degradation it noted (read as the resource's meter reads it).
        route.stats.count("fallback")
        marker = DEGRADED.get()  # (a marker older than this request is not its own)
        fresh = marker is not None and marker is not degraded_before
        route.stats.settle(marker.outcome if marker is not None and fresh else "error", "fallback")
        answer = Answer(200, [("Content-Type", "application/json")], _json(result))
        answer.headers.append((DEGRADED_HEADER, degraded_value("resource", "fallback")))
        return _answer(answer)

    def _attempt(self, pool: UpstreamPool, policy: Any, out: _Attempt) -> tuple[Call, _Attempt]:
        """The call that sends the request of ``out`` (another pool's try) to ``pool`` under
        ``policy``, and its tries: awaited as ``call.run_async(attempt)``, which gives an
        upstream answer (its ``endpoint`` noted), a failed :class:`Answer` once retries gave
        up, or a resource fallback's value; what it raises goes to :meth:`_elsewhere`. (The
        first pass builds its own inline, in :meth:`_exchange`.)"""
        call = _new(Call)
        _init_call(call, self.outbound, out.method, pool.name, policy, out.call.key)
        if isinstance(out.body, _Body):
            call.retryable = False  # streamed once: nothing to resend
        timeout = getattr(policy, "timeout", None)
        attempt = _new(_Attempt)
        _init_attempt(
            attempt,
            pool,
            call,
            out.method,
            out.path_qs,
            out.headers,
            out.body,
            out.fixed,
            out.forwarded_host,
            out.client_deadline,
            timeout.seconds if timeout is not None else None,
            self.table.error_body_limit,
        )
        return call, attempt

    async def _elsewhere(
        self, error: Exception, call: Call, attempt: _Attempt, policy: Any
    ) -> object:
        """After the first pass of ``call`` failed with ``error``: the tries on endpoints not
        tried yet, with the time the deadline has left, else ``error`` raised again.

        A try that failed at the gateway (timeout, connect, reset) goes to an endpoint not tried
        yet when the resource's retry refused it only because a retry "as long as the last try"
        would not fit in the deadline (:func:`_try_elsewhere`): the next endpoint gets what is
        left of the deadline, not a whole try's length."""
        made = _try_elsewhere(error, attempt, policy, 0, self.clock.monotonic())
        if not made:
            raise error
        pool = attempt.pool
        while True:
            pool.retries_elsewhere += 1
            attempt.failed = None
            try:
                with retry_marker(made + 1, f"gateway:{pool.name}"):
                    return await call.run_async(attempt)
            except Exception as again:
                made = _try_elsewhere(again, attempt, policy, made, self.clock.monotonic())
                if not made:
                    raise

    # -- failures and fallbacks ------------------------------------------------------------------

    async def _failed(
        self,
        request: Request,
        route: Route,
        out: _Attempt,
        kind: str,
        outcome: str,
        *,
        error: BaseException | None = None,
        answer: Answer | None = None,
    ) -> Response:
        """The answer to a request whose exchange failed with ``kind`` (``outcome``: what the
        dependency did): the route's fallback's when it has one, else the failure's."""
        stats = route.stats
        stats.count(kind if kind in stats.outcomes else "upstream_unavailable")
        if kind in route.fallback_on:
            fallback = await self._fallback(request, route, kind, out)
            if fallback is not None:
                stats.count("fallback")
                stats.settle(outcome, "fallback")
                return _answer(fallback)
        stats.settle(outcome, "error")
        if answer is not None:
            return _answer(answer)
        assert error is not None
        if isinstance(error, RejectedError):
            status = _STATUS_OF.get(kind)
            if status is None:
                return _refused(refusal(error))
            return _problem(status, kind, str(error))
        status = 504 if kind == "timeout" else 502
        detail = f"upstream {route.config.upstream!r}: {type(error).__name__}"
        if isinstance(error, UpstreamConnectError) and error.reason:
            detail = f"{detail}: {error.reason}"
        return _problem(status, kind, detail)

    async def _fallback(
        self, request: Request, route: Route, kind: str, out: _Attempt
    ) -> Answer | None:
        for source in route.fallback_order:
            if source == "cache" and route.cache is not None:
                hit = route.cache.get(self._cache_key(request), self.clock.monotonic())
                if hit is not None:
                    cached, age = hit
                    extra = (DEGRADED_HEADER, degraded_value("cache", kind, age))
                    return Answer(cached.status, [*cached.headers, extra], cached.body)
            elif source == "backup" and route.backup is not None:
                answer = await self._backup(route, kind, out)
                if answer is not None:
                    return answer
            elif source == "static" and route.static is not None:
                static = route.static
                extra = (DEGRADED_HEADER, degraded_value("static", kind))
                return Answer(static.status, [*static.headers, extra], static.body)
        return None

    async def _backup(self, route: Route, kind: str, out: _Attempt) -> Answer | None:
        backup = route.backup
        if backup is None or isinstance(out.body, _Body):
            return None  # a streamed body is gone: there is nothing to send the backup
        policy = route.backup_resource
        call, attempt = self._attempt(backup, policy, out)
        try:
            try:
                result = await call.run_async(attempt)
            except Exception as error:  # noqa: BLE001 - raised again unless tried elsewhere
                result = await self._elsewhere(error, call, attempt, policy)
        except (RejectedError, *_FAILURES) as exc:
            log.debug("route %s: backup upstream failed too: %r", route.name, exc)
            return None
        if not isinstance(result, UpstreamResponse):
            return None
        response = result
        try:
            async with asyncio.timeout(backup.config.read_timeout):
                data = await response.read()
        except (UpstreamError, TimeoutError) as exc:
            _body_ended(backup, response, exc)
            return None
        finally:
            response.release()
            result.endpoint.in_flight -= 1
        _body_ended(backup, response, None)
        headers = _copy_response_headers(response)
        headers.append((DEGRADED_HEADER, degraded_value("backup", kind)))
        return Answer(response.status, headers, data)

    def _cache_key(self, request: Request) -> str:
        return cache_key(normalise_host(request.host), request.path_qs, request.headers)

    # -- answering ------------------------------------------------------------------------------

    def _live(
        self,
        request: Request,
        route: Route,
        upstream: UpstreamResponse,
        table: Table,
        data: bytes | None = None,
    ) -> Response | None:
        """The answer to send for an upstream answer: whole (a ``HEAD``, no body, a small or a
        cached one: ``data``, its body read by :meth:`_whole`, or the body when it is all here
        already) or streamed; ``None`` when a whole body is still on its way (the caller then
        reads it with :meth:`_whole`). No coroutine of its own: the usual answer, small and
        complete, needs no wait."""
        status = upstream.status
        length = upstream.content_length
        method = request.method
        small = length is not None and length <= SMALL_BODY
        cache = route.cache
        keep = (
            cache is not None
            and cacheable_request(method, request.headers)
            and cacheable_response(status, upstream.headers, cache.config)
        )
        whole = method == "HEAD" or status in (204, 304) or small or keep
        if whole and data is None and method != "HEAD" and not upstream.complete:
            return None  # (the body is read first, without a timer when it is all here)
        endpoint: Endpoint = upstream.endpoint
        headers = _copy_response_headers(upstream, route.answer_dropped)
        if table.via:
            headers.append(("Via", "1.1 floodwall"))
        route.stats.answered += 1
        if not whole:
            return _Streaming(
                upstream,
                route.pool,
                status=status,
                headers=headers,
                length=length,
                limits=table.limits,
                read_timeout=route.pool.read_timeout,
            )
        if method == "HEAD":
            data = b""
        elif data is None:
            data = upstream.take()
        upstream.release()
        endpoint.in_flight -= 1
        if endpoint.streak:  # (_body_ended: the head left a run of failures open)
            _body_ended(route.pool, upstream, None)
        if keep and cache is not None:
            cache.put(
                self._cache_key(request),
                Answer(status, list(headers), data),
                self.clock.monotonic(),
            )
        if method == "HEAD" and length is not None:
            headers.append(("Content-Length", str(length)))
        response = _new(Response)
        _init_response(response, status, headers, data, reason=upstream.reason)
        response.clean = True  # (no field the route adds came through from the upstream)
        return response

    async def _whole(
        self, request: Request, route: Route, upstream: UpstreamResponse, table: Table
    ) -> Response:
        """:meth:`_live` for an answer whose whole body is still arriving: read first, within
        the pool's ``read_timeout`` (a 502 if it breaks, a 504 if it takes longer: nothing
        was sent yet, and the upstream did not answer in time)."""
        try:
            async with asyncio.timeout(route.pool.read_timeout):
                data = await upstream.read()
        except BaseException as exc:
            upstream.release()
            upstream.endpoint.in_flight -= 1
            if isinstance(exc, (TimeoutError, UpstreamError)):
                _body_ended(route.pool, upstream, exc)
            if isinstance(exc, TimeoutError):
                route.stats.count("timeout")
                route.stats.settle("timeout", "error")
                return _problem(504, "timeout", "upstream answer body stalled past read_timeout")
            if not isinstance(exc, UpstreamError):
                raise
            route.stats.count("upstream_unavailable")
            route.stats.settle("error", "error")
            return _problem(502, "upstream_unavailable", f"upstream answer broke: {exc!r}")
        response = self._live(request, route, upstream, table, data)
        assert response is not None
        return response


class _Streaming(Response):
    """An answer streamed from the upstream as it arrives (sent by :meth:`stream`)."""

    __slots__ = ("_length", "_pool", "_read_timeout", "_upstream", "_write_timeout")

    def __init__(
        self,
        upstream: UpstreamResponse,
        pool: UpstreamPool,
        *,
        status: int,
        headers: list[tuple[str, str]],
        length: int | None,
        limits: ClientLimits,
        read_timeout: float,
    ) -> None:
        super().__init__(status, headers, reason=upstream.reason)
        self.clean = True  # (built from the route's copy of the upstream's fields)
        self._length = length
        self._upstream = upstream
        self._pool = pool
        self._write_timeout = limits.write_timeout
        self._read_timeout = read_timeout

    async def stream(self, request: Request) -> None:
        upstream = self._upstream
        connection = request.connection
        assert connection is not None
        try:
            connection.begin(self, request, self._length)
            while True:
                try:
                    if upstream.ready:  # no timer to arm for what is here already
                        chunk = await upstream.readany()
                    else:
                        async with asyncio.timeout(self._read_timeout):
                            chunk = await upstream.readany()
                except (UpstreamError, TimeoutError) as exc:  # the endpoint's (not the client's)
                    _body_ended(self._pool, upstream, exc)
                    raise
                if not chunk:
                    break
                await connection.write(chunk, self._write_timeout)
            connection.end()
            if upstream.endpoint.streak:
                _body_ended(self._pool, upstream, None)
        except (UpstreamError, TimeoutError, ConnectionError) as exc:
            log.debug("streaming aborted: %r", exc)
            connection.abort()
        finally:
            upstream.release()
            upstream.endpoint.in_flight -= 1


# -- helpers -------------------------------------------------------------------------------------


def _rate_decision(
    route: Route, decision: Decision
) -> Refusal | tuple[tuple[tuple[str, str], ...], str]:
    """The refusal for a rate-limit ``decision`` that refused, else the ``RateLimit-*``
    fields of the answer, as fields and as head lines (:meth:`Route.rate_fields`)."""
    limiter = route.limiter
    assert limiter is not None
    if decision[0]:
        return route.rate_fields(decision)
    retry = decision[3]
    if isinstance(decision, StoreDownDecision):  # floodwall's outage: 503, no RateLimit-*
        why = f"rate limit of route {route.name!r}: the store is unavailable (fail_closed)"
        return refusal(LimitStoreUnavailableError(f"route {route.name}", why, retry))
    fields = rate_limit_headers(decision)
    window = limiter.window
    if window is not None:
        fields["RateLimit-Policy"] = f"{decision[4]};w={max(1, round(window))}"
    error = RateLimitedError(
        f"route {route.name}",
        f"rate limit of route {route.name!r} exceeded",
        None if retry == INF else retry,
    )
    return refusal(error, list(fields.items()))


def _rate_refused(route: Route, decision: Decision, rid_name: str, rid: str) -> Response:
    """The answer to a request the route's rate limit refused (counted in its figures)."""
    refused = _rate_decision(route, decision)
    assert isinstance(refused, Refusal)
    kind = refused.error.kind  # rate_limited, or store_unavailable (the store is down)
    route.stats.count(kind)
    route.stats.settle(kind, "error")
    return _with(_refused(refused), rid_name, rid, ())


def _try_elsewhere(
    error: BaseException, attempt: _Attempt, policy: Any, made: int, now: float
) -> int:
    """The tries made so far if ``error`` may be tried again on another endpoint, else 0
    (``made``: the tries made before the pass that failed, 0 for the first pass).

    It may when the last try failed at the gateway (a timeout, a connection refused or reset)
    and may be sent again (idempotent, or nothing was sent); the resource has a retry whose
    only objection was the deadline (on the first pass: its attempts, switch, level and
    idempotency rules all agreed), attempts are left, an endpoint not tried yet is available,
    at least :data:`MIN_TRY_TIME` of the request's deadline is left, and the retry budget
    grants it."""
    retry = getattr(policy, "retry", None)
    if retry is None or not attempt.failed:
        return 0
    if made:
        made += 1  # the pass that failed was one try (its retry saw the marker and stood back)
    else:
        record = gave_up(error)
        if record is None or record.cause != "deadline":
            return 0
        made = record.attempts
    left = remaining()
    if made >= retry.attempts or left is None or left < MIN_TRY_TIME:
        return 0
    if not attempt.pool.untried(attempt.tried):
        return 0
    budget = retry.budget
    if budget is not None and not budget.try_withdraw(now):
        return 0
    return made


HOSTS_KEPT: Final = 4096
"""Normalised ``Host`` values remembered (past it, the table starts over)."""
OWN_FORWARDING: Final = 4096
"""(peer, host) pairs whose forwarding fields are kept ready (past it, the set starts over)."""
_OWN_FORWARDING: dict[tuple[str | None, str], tuple[tuple[tuple[str, str], ...], str, str]] = {}


def _upstream_headers(  # noqa: PLR0917 - per request: positional arguments cost less
    request: Request,
    rid: str,
    trusted: bool,
    client: str | None,
    table: Table,
    plain: bool,
) -> tuple[list[tuple[str, str]], str, str]:
    """The fields to send upstream, this hop's forwarding fields as head lines when they are
    the same for every request of this peer and host (else ``""``: they are in the fields),
    and the ``X-Forwarded-Host`` sent (``plain``: the request has no ``Connection``)."""
    headers = request.headers
    dropped = REQUEST_DROPPED
    named = connection_tokens(headers) if not plain and "connection" in headers else None
    rid_name = table.request_id_lower
    out: list[tuple[str, str]] = []
    for item in request.raw_headers:
        lower = item[0].lower()
        if lower in dropped or lower == rid_name or (named is not None and lower in named):
            continue
        out.append(item)
    host = request.host
    fixed = ""
    if trusted:
        forwarding = forwarding_headers(
            headers,
            peer=request.remote,
            client=client,
            trusted=True,
            proto=request.scheme,
            host=host,
            forwarded_all=headers.get("forwarded") or None,
        )
        out.extend(forwarding)
        forwarded_host = client_host_of(forwarding)
    else:  # what a client claimed is replaced by what this hop saw: the same for a peer+host
        key = (request.remote, host)
        mine = _OWN_FORWARDING.get(key)
        if mine is None:
            if len(_OWN_FORWARDING) >= OWN_FORWARDING:
                _OWN_FORWARDING.clear()
            mine = _OWN_FORWARDING[key] = _own_forwarding(request, client)
        fields, fixed, forwarded_host = mine
        if not fixed:
            out.extend(fields)
    out.append((table.request_id, rid))
    if table.via:
        out.append(("Via", "1.1 floodwall"))
    return out, fixed, forwarded_host


def _own_forwarding(
    request: Request, client: str | None
) -> tuple[tuple[tuple[str, str], ...], str, str]:
    """This hop's forwarding fields for a peer and host (no trusted proxy before it), the
    same as head lines (``""`` if a value would break its line: the fields then go through
    the client's own check), and the ``X-Forwarded-Host`` sent."""
    fields = tuple(
        forwarding_headers(
            request.headers,
            peer=request.remote,
            client=client,
            trusted=False,
            proto="http",
            host=request.host,
        )
    )
    text = "".join(f"{name}: {value}\r\n" for name, value in fields)
    if text.count("\n") != len(fields) or text.count("\r") != len(fields):
        text = ""
    return fields, text, client_host_of(fields)


def client_host_of(headers: Sequence[tuple[str, str]]) -> str:
    """The client's host, as the proxy recorded it in ``X-Forwarded-Host``."""
    for name, value in headers:
        if name == "X-Forwarded-Host":
            return value
    return ""


def _copy_response_headers(
    answer: UpstreamResponse, dropped: frozenset[str] = RESPONSE_DROPPED
) -> list[tuple[str, str]]:
    """The answer's fields a client may see: hop-by-hop ones (and those its ``Connection``
    names), framing, and ``dropped`` (the route's own fields) left out."""
    out = []
    for item in answer.raw_headers:  # (a loop: CPython 3.11 runs a comprehension as a call)
        if item[0].lower() not in dropped:
            out.append(item)  # noqa: PERF401 - see the line above
    connection = answer.connection
    if connection is None:
        return out
    named = connection_tokens({"connection": connection})
    return [(name, value) for name, value in out if name.lower() not in named]


def _strip(path_qs: str, prefix: str) -> str:
    if not path_qs.startswith(prefix):
        return path_qs
    rest = path_qs[len(prefix) :]
    return rest if rest.startswith("/") else "/" + rest


async def _buffered(response: UpstreamResponse, limit: int) -> Answer:
    """A failed answer, read up to ``limit`` bytes, its connection given back."""
    try:
        data = await response.read(limit)
    except (UpstreamError, TimeoutError):
        data = b""
    finally:
        response.release()
    return Answer(response.status, _copy_response_headers(response), data)


def _json(value: object) -> bytes:
    return json.dumps(value, default=str, separators=(",", ":")).encode()


def _answer(answer: Answer) -> Response:
    return Response(answer.status, list(answer.headers), answer.body)


def _refused(refused: Refusal) -> Response:
    return Response(refused.status, list(refused.headers), refused.body)


def _with(
    response: Response, rid_name: str, rid: str, fields: Sequence[tuple[str, str]] = ()
) -> Response:
    """``response`` with the request id and ``fields``, each replacing a field of its name the
    upstream sent (one pass over the answer's fields)."""
    headers = response.headers
    if fields or headers:
        names = {rid_name.lower(), *(name.lower() for name, _ in fields)}
        if any(name.lower() in names for name, _ in headers):
            headers[:] = [(n, v) for n, v in headers if n.lower() not in names]
        headers.extend(fields)
    headers.append((rid_name, rid))
    return response


_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})
"""What the guard is shown of a request that has none of the headers it reads (it then parses
none: about 1.5 k instructions per request)."""
_inbound = partial(tuple.__new__, Inbound)
"""``Inbound`` from a tuple, without a Python-level ``__new__`` per request."""


def _framing_error(version: str, coding: str) -> Response | None:
    """The refusal of a request's ``Transfer-Encoding``, or ``None`` for a plain ``chunked``
    in HTTP/1.1. llhttp already refused ``chunked`` that is not last or comes twice; a coding
    before it (``gzip, chunked``) is a 501 (RFC 9112 §6.1, nginx's answer; HAProxy's is 422):
    the body would reach the upstream still coded, with no field left to say so."""
    if version == "1.0":
        return _problem(400, "bad_framing", "Transfer-Encoding in an HTTP/1.0 request", close=True)
    if coding.strip().lower() != "chunked":
        why = f"Transfer-Encoding {coding!r} is not implemented (only chunked)"
        return _problem(501, "not_implemented", why, close=True)
    return None


def _problem(status: int, kind: str, detail: str, *, close: bool = False) -> Response:
    body = problem(status, kind, detail)
    return Response(status, [("Content-Type", PROBLEM_JSON)], body, close=close)
