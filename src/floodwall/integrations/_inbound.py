"""The inbound guard core the ASGI, WSGI and gRPC servers share: no framework, no I/O.

A server shell describes each request as an :class:`Inbound` (method, path, lower-case headers,
peer address) and asks :meth:`InboundGuard.admit`. The answer is a :class:`Refusal` to send as is
(status, headers, RFC 9457 problem body) or an :class:`Admission` to serve the request under.
In this order, cheapest first:

1. **deadline**: ``X-Request-Deadline`` (or ``grpc-timeout``) sets the ambient deadline of the
   handler (capped at ``max_deadline``; ``deadline`` when none came); one that has already passed
   is answered 504 at once: its caller has stopped waiting.
2. **rate limits** (:class:`RateLimit`): every limit whose route and methods match takes one
   permit, per key (client IP honouring trusted proxies, a header, or a callable); a refusal is
   429 with ``Retry-After`` and ``RateLimit-*``; with ``rate_limit_headers=True`` admitted
   answers carry the ``RateLimit-*`` of the most depleted limit too.
3. **shedding**: the :class:`~floodwall.adaptive.LoadShedder` admits or refuses (503 with
   ``Retry-After``), fed the queueing time from ``X-Request-Start`` and the DAGOR priority from
   ``X-Request-Priority``; a DAGOR server reports its level on every answer
   (``X-Admission-Level``).

Under the :class:`Admission` (a context manager) the handler sees the deadline, the retry marker
from ``X-Retry-Attempt`` (so its own calls do not retry), the priority and a fresh
:class:`~floodwall.CallContext`; :meth:`Admission.response_headers` says what to add to its answer
(``RateLimit-*``, the admission level, ``X-Retry-Pushback-Ms: -1`` on a failure that was retried
below, ``X-Degraded`` when a fallback answered), and :meth:`Admission.close` ends the shedding
ticket (success below 500, dropped on 503/504 and timeouts, ignored otherwise).

**Idempotency** (unsafe methods with an ``Idempotency-Key``, when an
:class:`~floodwall.Idempotency` is configured) needs the request body and runs the handler, so the
shells drive it with :meth:`InboundGuard.idempotent` / :meth:`InboundGuard.idempotent_async`
around a function that produces a :class:`Captured` answer: stored when below 500 and replayed to
repeats (``Idempotent-Replayed: true``); a concurrent duplicate is answered 409, a key reused for
another request 422, a store outage 503 (``fail_closed``).

**Degradation** is visible to handlers through the admission (``request.state.floodwall`` in
ASGI, ``environ["floodwall"]``, :func:`current_admission` anywhere):
:meth:`Admission.degraded` says whether a dependency of the registry is shed by level or has its
breaker open.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import ipaddress
import math
import threading
import time
from collections.abc import (
    Awaitable,
    Callable,
    Generator,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Final, NamedTuple, Protocol, TypedDict

from floodwall import context as _context
from floodwall._core import validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.drivers import drive_async, drive_sync
from floodwall._core.errors import ConfigError, RateLimitedError, RejectedError, TimeoutExceeded
from floodwall._core.steps import CALL, Step
from floodwall._core.tally import Tally
from floodwall.adaptive.dagor import QueueingTimeAdmission
from floodwall.adaptive.shedding import LoadShedder, Ticket
from floodwall.breaker import CircuitState
from floodwall.context import (
    CallContext,
    Deadline,
    RetryMarker,
)
from floodwall.integrations import _wire
from floodwall.integrations._wire import (
    ADMISSION_LEVEL,
    DEGRADED,
    PROBLEM_JSON,
    RETRY_AFTER,
    RETRY_PUSHBACK,
    Hop,
    format_degraded,
    format_level,
    parse_attempt,
    parse_deadline,
    parse_grpc_timeout,
    parse_level,
    parse_request_start,
    problem,
    rejection_status,
    whole_seconds,
)
from floodwall.ratelimit._base import INF, Decision, RateLimiter
from floodwall.ratelimit.gcra import GCRA
from floodwall.ratelimit.headers import rate_limit_headers
from floodwall.ratelimit.keyed import Keyed
from floodwall.shared.idempotency import Idempotency

# Assigned, not imported by name: CPython 3.11 calls a method of an import-bound name through
# a bound method made per call (docs/gateway.md, "A fifth pass").
_DEADLINE = _context._DEADLINE
_IDEMPOTENCY_KEY = _context._IDEMPOTENCY_KEY
_RETRY = _context._RETRY
_HOP = _wire._HOP
_PRIORITY = _wire._PRIORITY

__all__ = [
    "UNSAFE_METHODS",
    "Admission",
    "Captured",
    "GuardOptions",
    "Inbound",
    "InboundGuard",
    "KeyFunc",
    "RateLimit",
    "Refusal",
    "by_header",
    "client_ip",
    "current_admission",
    "no_priority",
]

UNSAFE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""RFC 9110 §9.2.1: the methods that are not safe, deduplicated by ``Idempotency-Key``."""
UPSTREAM: Final = "upstream"
"""The ``origin`` of a retry marker that arrived in a request header."""

Headers = list[tuple[str, str]]


class Inbound(NamedTuple):
    """One request as the guard sees it: ``headers`` maps lower-case names to values (repeated
    headers joined with ``", "``); ``client`` is the peer's IP address, if known.

    A tuple, so a shell can build one in C (``tuple.__new__(Inbound, (...))``) per request."""

    method: str
    path: str
    headers: Mapping[str, str]
    client: str | None = None


KeyFunc = Callable[[Inbound], Hashable | None]
"""Picks a request's rate-limit key; ``None`` puts it in the one shared anonymous bucket. A key
function may list the headers it reads in a ``headers`` attribute (lower-case names), so shells
decode only those; without it a shell hands it every header."""

GUARD_HEADERS: Final = frozenset(
    {
        "x-request-deadline",
        "grpc-timeout",
        "x-retry-attempt",
        "x-request-priority",
        "x-request-start",
        "idempotency-key",
    }
)
"""The request headers the guard itself reads."""


def _networks(
    trusted: Iterable[str],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    try:
        return tuple(ipaddress.ip_network(t, strict=False) for t in trusted)
    except ValueError as exc:
        raise ConfigError(f"trusted_proxies: {exc}") from None


def _peer(request: Inbound) -> Hashable | None:
    """The peer address: :func:`client_ip` without trusted proxies (the guard inlines it)."""
    return request.client


_peer.headers = ()  # type: ignore[attr-defined]


def no_priority(request: Inbound) -> None:
    """A guard's ``priority`` that gives no request a priority, not even from its
    ``X-Request-Priority`` (``priority=None`` reads that header); the guard never calls it."""
    return


no_priority.headers = ()  # type: ignore[attr-defined]


def client_ip(trusted_proxies: Iterable[str] = ()) -> KeyFunc:
    """Key by client IP: the peer address, or, when the peer is a trusted proxy (addresses or
    networks such as ``"10.0.0.0/8"``), the right-most ``X-Forwarded-For`` entry that is not a
    trusted proxy. Untrusted peers cannot spoof their address with the header."""
    nets = _networks(trusted_proxies)
    if not nets:
        return _peer

    def trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in nets)

    def key(request: Inbound) -> Hashable | None:
        peer = request.client
        if peer is None or not trusted(peer):
            return peer
        forwarded = request.headers.get("x-forwarded-for", "")
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not trusted(hop):
                return hop
        return hops[0] if hops else peer

    key.headers = ("x-forwarded-for",)  # type: ignore[attr-defined]
    return key


def by_header(name: str) -> KeyFunc:
    """Key by a request header (an API key, a tenant id); requests without it share a bucket."""
    lower = name.lower()

    def key(request: Inbound) -> Hashable | None:
        return request.headers.get(lower)

    key.headers = (lower,)  # type: ignore[attr-defined]
    return key


class RateLimit:
    """One limit of the inbound guard: what it counts, and per what.

    ``limiter`` is any :class:`~floodwall.ratelimit.RateLimiter` or a rate (``"100/s"`` builds a
    :class:`~floodwall.ratelimit.GCRA`). ``route`` is a path (``"/login"``) or a prefix
    (``"/api/*"``), default every path; ``methods`` limits it to those methods. ``key`` is
    ``"ip"`` (:func:`client_ip` with ``trusted_proxies``), ``"header:NAME"``, or a
    :data:`KeyFunc`; with a key the limiter is wrapped in :class:`~floodwall.ratelimit.Keyed`
    (one state per key, bounded memory) unless it already is. ``cost`` is the permits a request
    takes.

    What a request needs is worked out here, once: whether the limit applies everywhere (no
    route, no methods: no matching per request), and the limiter's admission without figures
    (``RateLimit-*`` figures are computed only for refusals, unless the guard reports them).
    """

    __slots__ = ("cost", "everywhere", "key", "limiter", "methods", "prefix", "route", "take")

    def __init__(
        self,
        limiter: RateLimiter[Any] | str,
        *,
        route: str | None = None,
        methods: Iterable[str] | None = None,
        key: KeyFunc | str | None = None,
        trusted_proxies: Iterable[str] = (),
        cost: int = 1,
    ) -> None:
        if isinstance(limiter, str):
            limiter = GCRA(limiter, name=f"http:{route or '*'}")
        if not isinstance(limiter, RateLimiter):
            raise ConfigError(f"limiter must be a RateLimiter or a rate string, got {limiter!r}")
        if isinstance(key, str):
            key = _key_named(key, trusted_proxies)
        if key is not None and not isinstance(limiter, Keyed):
            limiter = Keyed(limiter)
        validate.count("cost", cost, 0)
        self.limiter: RateLimiter[Any] = limiter
        self.key = key
        self.cost = cost
        self.route = route
        self.prefix = route is not None and route.endswith("*")
        self.methods = None if methods is None else frozenset(m.upper() for m in methods)
        self.everywhere = route is None and methods is None
        self.take: Callable[[Hashable, float], Decision | None] = limiter._admit
        """``take(key, cost)``: ``None`` when admitted, else the refusal with its figures."""

    def matches(self, method: str, path: str) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        route = self.route
        if route is None:
            return True
        return path.startswith(route[:-1]) if self.prefix else path == route

    def acquire(self, request: Inbound) -> Decision:
        key = None if self.key is None else self.key(request)
        return self.limiter.acquire(key, self.cost)


def _key_named(name: str, trusted_proxies: Iterable[str]) -> KeyFunc:
    if name == "ip":
        return client_ip(trusted_proxies)
    if name.startswith("header:") and len(name) > len("header:"):
        return by_header(name[len("header:") :])
    raise ConfigError(f"key must be 'ip', 'header:NAME' or a callable, got {name!r}")


@dataclass(slots=True)
class Refusal:
    """An answer the guard gives instead of the handler."""

    status: int
    headers: Headers
    body: bytes
    error: RejectedError


def refusal(
    error: RejectedError, headers: Headers | None = None, *, type_base: str | None = None
) -> Refusal:
    """The answer to ``error``: its status, ``Retry-After`` when known, a problem body."""
    status = rejection_status(error)
    out = list(headers or ())
    retry_after = error.retry_after
    known = retry_after is not None and math.isfinite(retry_after)
    if known and not any(name == RETRY_AFTER for name, _ in out):
        assert retry_after is not None
        out.append((RETRY_AFTER, whole_seconds(retry_after)))
    out.append(("Content-Type", PROBLEM_JSON))
    body = problem(status, error.kind, str(error), retry_after=retry_after, type_base=type_base)
    return Refusal(status, out, body, error)


# -- what handlers see -----------------------------------------------------------------------


class ResourceSource(Protocol):
    """A registry, duck-typed (no import of the config layer)."""

    def get(self, name: str) -> Any: ...

    def is_shed(self, level: int) -> bool: ...


def current_admission() -> Admission | None:
    """The :class:`Admission` of the inbound request being served, or ``None``."""
    hop = _HOP.get()  # an admission is its request's Hop
    return hop if isinstance(hop, Admission) else None


_UNSET: Any = object()
_new = object.__new__


class Admission(Hop):
    """An admitted request: the context its handler runs in, and what its answer carries.

    Enter it (``with``) around the handler: it sets the deadline, the retry marker, the
    priority and a fresh call context, and makes itself the request's
    :class:`~floodwall.integrations._wire.Hop` (its outbound calls mark ``final`` on it); it
    resets them on exit. Read by handlers: :attr:`deadline`, :meth:`remaining`, :attr:`attempt`,
    :attr:`priority`, :meth:`degraded`.
    """

    __slots__ = (
        "_deadline_token",
        "_extra",
        "_guard",
        "_token",
        "attempt",
        "call",
        "deadline",
        "priority",
        "rate_headers",
        "status",
        "ticket",
    )

    def __init__(  # noqa: PLR0917 - built per request: positional arguments cost less
        self,
        guard: InboundGuard,
        deadline: Deadline | None,
        attempt: int | None,
        priority: tuple[int, int] | None,
        rate_headers: Headers,
        ticket: Ticket | None,
    ) -> None:
        self._guard = guard
        self.deadline = deadline
        self.attempt = attempt
        """The caller's retry attempt (>= 2) from ``X-Retry-Attempt``, or ``None``."""
        self.priority = priority
        self.rate_headers = rate_headers
        self.ticket = ticket
        self.final = False
        self.status = 0
        """The status of the answer once the shell has seen it (``0`` before): the ASGI shell
        records it here, so its ``send`` wrapper needs no variable of its own."""
        # CallContext() written out: on CPython 3.11 a class call with a Python __init__
        # re-enters the interpreter from C, which costs more than these stores.
        call = self.call = _new(CallContext)
        call.degraded_by = None
        call.degraded_reason = None
        self._token: contextvars.Token[Hop | None] | None = None
        self._deadline_token: contextvars.Token[Deadline | None] | None = None
        self._extra: tuple[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]], ...] = ()

    @property
    def hop(self) -> Hop:
        """The request's :class:`~floodwall.integrations._wire.Hop`: the admission itself."""
        return self

    def remaining(self) -> float | None:
        """Seconds left before the request's deadline, or ``None`` without one."""
        return None if self.deadline is None else self.deadline.remaining()

    def degraded(self, name: str) -> bool:
        """Whether dependency ``name`` of the guard's registry is degraded now: its level shed
        by an operator, or its circuit breaker open. ``False`` without a registry."""
        registry = self._guard.registry
        if registry is None:
            return False
        resource = registry.get(name)
        if registry.is_shed(resource.level):
            return True
        breaker = getattr(resource, "breaker", None)
        return breaker is not None and breaker.state in (
            CircuitState.OPEN,
            CircuitState.FORCED_OPEN,
        )

    def __enter__(self) -> Admission:
        # One variable: current_call() finds self.call through the request record.
        self._token = _HOP.set(self)
        deadline = self.deadline
        if deadline is not None:  # (the usual case behind a gateway route with a timeout:
            self._deadline_token = _DEADLINE.set(deadline)  # no helper call, no tuple)
        attempt, level = self.attempt, self.priority
        if attempt is not None or level is not None:
            self._extra = self._set_extra(attempt, level)
        return self

    @staticmethod
    def _set_extra(
        attempt: int | None, level: tuple[int, int] | None
    ) -> tuple[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]], ...]:
        """Set the retry marker and priority the request brought (most requests bring none)."""
        extra: list[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]] = []
        if attempt is not None:
            extra.append((_RETRY, _RETRY.set(RetryMarker(attempt, UPSTREAM))))
        if level is not None:
            extra.append((_PRIORITY, _PRIORITY.set(level)))
        return tuple(extra)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        extra = self._extra
        if extra:
            self._extra = ()
            for var, set_token in extra:
                var.reset(set_token)
        deadline_token = self._deadline_token
        if deadline_token is not None:
            self._deadline_token = None
            _DEADLINE.reset(deadline_token)
        token = self._token
        if token is not None:
            self._token = None
            _HOP.reset(token)

    def response_headers(self, status: int) -> Headers:
        """What to add to the handler's answer (``status``): see
        [Integrations][guide-integrations]."""
        out = self.rate_headers
        if (
            not self._guard.adds_headers
            and self.call.degraded_by is None
            and (status < 500 or not self.final)
        ):
            return out  # the common answer: nothing to add
        extra: Headers = []
        level = self._guard._level()
        if level is not None:
            extra.append((ADMISSION_LEVEL, level))
        if status >= 500 and self.final:
            extra.append((RETRY_PUSHBACK, "-1"))
        by = self.call.degraded_by
        if by is not None:
            extra.append((DEGRADED, format_degraded(by, self.call.degraded_reason)))
        return out + extra if extra else out

    def close(self, status: int | None = None, error: BaseException | None = None) -> None:
        """End the shedding ticket: a success below 500, dropped on 503/504 or a timeout or
        rejection, ignored otherwise (idempotent)."""
        ticket = self.ticket
        if ticket is None:
            return
        if error is None and (status is None or status < 500):
            ticket.success()
        elif error is not None:
            if isinstance(error, TimeoutError | RejectedError):
                ticket.dropped()
            else:
                ticket.ignore()
        elif status in (503, 504):
            ticket.dropped()
        else:
            ticket.ignore()


_init_admission = Admission.__init__


# -- captured answers (idempotency) ------------------------------------------------------------


@dataclass(slots=True)
class Captured:
    """A whole answer, as stored for idempotent replay."""

    status: int
    headers: Headers = field(default_factory=list)
    body: bytes = b""

    def encode(self) -> dict[str, Any]:
        return {
            "s": self.status,
            "h": [[name, value] for name, value in self.headers],
            "b": base64.b64encode(self.body).decode("ascii"),
        }

    @classmethod
    def decode(cls, data: Mapping[str, Any]) -> Captured:
        headers = [(str(name), str(value)) for name, value in data["h"]]
        return cls(int(data["s"]), headers, base64.b64decode(data["b"]))


class _Unstored(Exception):  # noqa: N818 - a carrier, never seen outside this module
    """Carries a 5xx answer out of the idempotent call so its claim is released, not stored."""

    def __init__(self, captured: Captured) -> None:
        super().__init__(captured.status)
        self.captured = captured


_SKIPPED_ON_REPLAY: Final = frozenset({"date", "server", "content-length", "transfer-encoding"})


def fingerprint(request: Inbound, body: bytes) -> str:
    """SHA-256 of the method, the path and the body: a reused key with another request is told
    apart (422)."""
    digest = hashlib.sha256()
    digest.update(f"{request.method} {request.path}\n".encode())
    digest.update(body)
    return digest.hexdigest()


# -- the guard ---------------------------------------------------------------------------------


class GuardOptions(TypedDict, total=False):
    """The keyword options of :class:`InboundGuard`, which every server shell also takes."""

    limits: Sequence[RateLimit]
    shedder: LoadShedder | None
    idempotency: Idempotency | None
    idempotency_methods: Iterable[str]
    registry: ResourceSource | None
    deadline: float | None
    max_deadline: float | None
    priority: Callable[[Inbound], tuple[int, int] | None] | None
    rate_limit_headers: bool
    problem_type_base: str | None
    answer_rejections: bool
    clock: Clock
    wall: Callable[[], float]


class InboundGuard:
    """The inbound guard core (see [Integrations][guide-integrations]).

    ``limits``: :class:`RateLimit` s, each consulted when it matches. ``shedder``: a
    :class:`~floodwall.adaptive.LoadShedder`. ``idempotency``: an
    :class:`~floodwall.Idempotency` (give it ``fingerprint=str``: the guard passes the request's
    fingerprint) for ``idempotency_methods`` (default: the unsafe ones). ``registry``: the
    dependencies handlers may ask :meth:`Admission.degraded` about. ``deadline``: seconds given
    to a request that brings none (default: none); ``max_deadline``: cap on a received one.
    ``priority``: picks ``(business, user)`` for a request (default: ``X-Request-Priority``;
    :func:`no_priority`: none); like a key function it may list the headers it reads in a
    ``headers`` attribute.
    ``rate_limit_headers``: add ``RateLimit-*`` to admitted answers too (default off, as in
    Envoy and slowapi: refusals always carry them; on success they cost a few µs per answer).
    ``answer_rejections``: answer a :class:`~floodwall.RejectedError` the app raised (an open
    breaker, a full bulkhead, a timeout deep in a handler) as the guard answers its own refusals,
    503 with ``Retry-After`` / 429 / 504 and a problem body, instead of letting it become a bare
    500 (default on).
    """

    def __init__(
        self,
        *,
        limits: Sequence[RateLimit] = (),
        shedder: LoadShedder | None = None,
        idempotency: Idempotency | None = None,
        idempotency_methods: Iterable[str] = UNSAFE_METHODS,
        registry: ResourceSource | None = None,
        deadline: float | None = None,
        max_deadline: float | None = None,
        priority: Callable[[Inbound], tuple[int, int] | None] | None = None,
        rate_limit_headers: bool = False,
        problem_type_base: str | None = None,
        answer_rejections: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        wall: Callable[[], float] = time.time,
    ) -> None:
        for item in limits:
            if not isinstance(item, RateLimit):
                raise ConfigError(f"limits must be RateLimit objects, got {item!r}")
        if shedder is not None and not isinstance(shedder, LoadShedder):
            raise ConfigError(f"shedder must be a LoadShedder, got {shedder!r}")
        if idempotency is not None and not isinstance(idempotency, Idempotency):
            raise ConfigError(f"idempotency must be an Idempotency policy, got {idempotency!r}")
        for name, value in (("deadline", deadline), ("max_deadline", max_deadline)):
            if value is not None:
                validate.seconds(name, value, positive=True)
        self.limits = tuple(limits)
        self._quiet_limits = () if rate_limit_headers else self.limits
        """The limits taken without figures (all of them, unless answers report figures)."""
        self._nothing_read = (deadline, None, None, None)
        """What :meth:`_read` finds in a request without any of the guard's headers."""
        self.shedder = shedder
        self.idempotency = idempotency
        self.idempotency_methods = frozenset(m.upper() for m in idempotency_methods)
        self.registry = registry
        self.deadline = deadline
        self.max_deadline = max_deadline
        self.priority = priority
        self.rate_limit_headers = rate_limit_headers
        self.problem_type_base = problem_type_base
        self.answer_rejections = answer_rejections
        self._admitted = Tally()
        self._refused: dict[tuple[str, str], int] = {}
        self._refused_lock = threading.Lock()
        self.clock = clock
        self.wall = wall
        limiter = shedder.limiter if shedder is not None else None
        self._dagor = limiter if isinstance(limiter, QueueingTimeAdmission) else None
        self.adds_headers = rate_limit_headers or self._dagor is not None
        """Whether every answer may get headers; when False, :meth:`Admission.response_headers`
        is empty for a status below 500 unless a fallback answered (``call.degraded_by``), so a
        shell can skip asking."""
        self._plain = (
            not self.limits and shedder is None and (priority is None or priority is no_priority)
        )
        """No rate limit, shedder or priority function: :meth:`admit` has only the headers'
        deadline and retry marker to read (a gateway route's guard, usually)."""
        self.wanted_headers = self._wanted()
        """Lower-case names of the request headers the guard reads, or ``None`` for all (a
        key or priority function that does not list its headers)."""

    def _wanted(self) -> frozenset[str] | None:
        names = set(GUARD_HEADERS)
        if self.priority is not None:
            listed = getattr(self.priority, "headers", None)
            if listed is None:
                return None
            names.update(listed)
        for limit in self.limits:
            if limit.key is not None:
                listed = getattr(limit.key, "headers", None)
                if listed is None:
                    return None
                names.update(listed)
        return frozenset(names)

    # -- admission --------------------------------------------------------------------------

    def admit(self, request: Inbound) -> Admission | Refusal:  # noqa: PLR0912 - one pass
        """Admit ``request`` (an :class:`Admission`) or refuse it (a :class:`Refusal`).

        A request that carries none of the guard's headers (the shells pass only those, when
        they can) skips every parser: the usual request costs its rate limits and its shedding
        ticket, little else.
        """
        headers = request.headers
        seconds, attempt, level, start = self._read(headers) if headers else self._nothing_read
        deadline = None
        if seconds is not None:
            if seconds <= 0:
                return self._refuse(_expired(), [])
            clock = self.clock
            deadline = _new(Deadline)  # (Deadline(...) without a class call: see Admission)
            deadline.at = clock.monotonic() + seconds
            deadline.clock = clock
        rate_headers: Headers = []
        ticket = None
        if not self._plain:  # (a limit, priority or shedder of its own: else about 0.5 k less)
            for limit in self._quiet_limits:  # the common case, inline: no figures unless refused
                if limit.everywhere or limit.matches(request.method, request.path):
                    key_of = limit.key
                    key = (
                        request.client
                        if key_of is _peer
                        else None
                        if key_of is None
                        else key_of(request)
                    )
                    refused = limit.take(key, limit.cost)
                    if refused is not None:
                        return self._rate_refusal(limit, refused)
            if self.rate_limit_headers and self.limits:
                reported = self._rate_limits(request, rate_headers)
                if reported is not None:
                    return reported
            priority = self.priority
            if priority is not None and priority is not no_priority:
                level = priority(request)
            shedder = self.shedder
            if shedder is not None:
                try:
                    if start is None and level is None:
                        ticket = shedder.admit()
                    else:
                        ticket = self._shed(start, level)
                except RejectedError as error:
                    return self._refuse(error, self._level_headers())
        # Admission(...) without type.__call__: on CPython 3.11 a class call re-enters the
        # interpreter from C to run __init__; calling __init__ itself from here does not.
        admission: Admission = _new(Admission)
        _init_admission(admission, self, deadline, attempt, level, rate_headers, ticket)
        self._admitted.add()
        return admission

    def _read(
        self, headers: Mapping[str, str]
    ) -> tuple[float | None, int | None, tuple[int, int] | None, str | None]:
        """``(deadline seconds, retry attempt, priority, X-Request-Start)`` from the headers;
        the deadline is the received one capped at ``max_deadline``, else ``deadline``."""
        # (each parser is called only for a header that came: most requests bring none)
        raw = headers.get("x-request-deadline")
        seconds = None if raw is None else parse_deadline(raw)
        if seconds is None:
            raw = headers.get("grpc-timeout")
            seconds = None if raw is None else parse_grpc_timeout(raw)
        if seconds is None:
            seconds = self.deadline
        elif self.max_deadline is not None:
            seconds = min(seconds, self.max_deadline)
        raw = headers.get("x-retry-attempt")
        attempt = None if raw is None else parse_attempt(raw)
        level = (
            None if self.priority is not None else parse_level(headers.get("x-request-priority"))
        )
        return seconds, attempt, level, headers.get("x-request-start")

    def _rate_limits(self, request: Inbound, out: Headers) -> Refusal | None:
        """The limits with their figures, for ``rate_limit_headers=True``: the most depleted
        limit's ``RateLimit-*`` go into ``out``."""
        method, path = request.method, request.path
        tightest: tuple[Decision, RateLimit] | None = None
        for limit in self.limits:
            if not limit.everywhere and not limit.matches(method, path):
                continue
            key_of = limit.key
            key = request.client if key_of is _peer else None if key_of is None else key_of(request)
            decision = limit.limiter.acquire(key, limit.cost)
            if not decision[0]:
                return self._rate_refusal(limit, decision)
            if tightest is None or decision[1] < tightest[0][1]:
                tightest = (decision, limit)
        if tightest is not None:
            decision, limit = tightest
            out.extend(rate_limit_headers(decision, limiter=limit.limiter).items())
        return None

    def _rate_refusal(self, limit: RateLimit, decision: Decision) -> Refusal:
        headers = rate_limit_headers(decision, limiter=limit.limiter)
        return self._refuse(_rate_limited(limit, decision), list(headers.items()))

    def _shed(self, start: str | None, level: tuple[int, int] | None) -> Ticket:
        assert self.shedder is not None
        queued = None if start is None else parse_request_start(start, self.wall())
        business, user = level if level is not None else (0, 0)
        return self.shedder.admit(queue_time=queued, business=business, user=user)

    def _level(self) -> str | None:
        dagor = self._dagor
        return None if dagor is None else format_level(dagor.level)

    def _level_headers(self) -> Headers:
        level = self._level()
        return [] if level is None else [(ADMISSION_LEVEL, level)]

    def _refuse(self, error: RejectedError, headers: Headers, outcome: str = "refused") -> Refusal:
        self._count(outcome, error.kind)
        return refusal(error, headers, type_base=self.problem_type_base)

    def _count(self, outcome: str, reason: str) -> None:
        key = (outcome, reason)
        with self._refused_lock:
            self._refused[key] = self._refused.get(key, 0) + 1

    def decisions(self) -> dict[tuple[str, str], int]:
        """Requests by ``(outcome, reason)``: ``("admitted", "admitted")``, ``("refused",
        kind)`` for the guard's own refusals (``rate_limited``, ``overloaded``, ``timeout``
        for a deadline already passed, idempotency conflicts, …) and ``("app_rejected", kind)``
        for a floodwall rejection the app raised and the middleware answered."""
        with self._refused_lock:
            out = dict(self._refused)
        out["admitted", "admitted"] = self._admitted.value
        return out

    def rejection_answer(self, error: BaseException) -> Refusal | None:
        """The problem+json answer to a :class:`~floodwall.RejectedError` the app raised
        (counted as ``app_rejected``), for a framework that answers a handler's exception
        itself (Flask); ``None`` for anything else, or with ``answer_rejections`` off."""
        if not self.answer_rejections or not isinstance(error, RejectedError):
            return None
        return self._refuse(error, [], "app_rejected")

    def answer_error(self, error: BaseException, admitted: Admission) -> Refusal | None:
        """The answer to ``error`` raised by the app before it answered: a problem+json
        refusal for a :class:`~floodwall.RejectedError` (with ``answer_rejections``), ending
        the admission's ticket with that status; ``None`` for anything else (re-raise it)."""
        if not self.answer_rejections or not isinstance(error, RejectedError):
            return None
        status = rejection_status(error)
        answer = self._refuse(error, admitted.response_headers(status), "app_rejected")
        admitted.status = answer.status
        admitted.close(answer.status)
        return answer

    # -- idempotency ------------------------------------------------------------------------

    def idempotency_key(self, request: Inbound) -> str | None:
        """The key to deduplicate ``request`` by, or ``None`` when it is not deduplicated."""
        if self.idempotency is None or request.method not in self.idempotency_methods:
            return None
        return request.headers.get("idempotency-key") or None

    def idempotent(
        self, request: Inbound, body: bytes, produce: Callable[[], Captured]
    ) -> tuple[Captured, bool] | Refusal:
        """Run ``produce`` once per :meth:`idempotency_key` of ``request`` (which must have
        one): ``(answer, replayed)``, or a refusal (409/422/503)."""
        ran: list[bool] = []

        def run(_: str) -> dict[str, Any]:
            return drive_sync(_produced(ran), produce)  # type: ignore[no-any-return]

        idem, steps = self._idempotent(request, ran)
        return drive_sync(steps, partial(idem.call, run, fingerprint(request, body)))  # type: ignore[no-any-return]

    async def idempotent_async(
        self, request: Inbound, body: bytes, produce: Callable[[], Awaitable[Captured]]
    ) -> tuple[Captured, bool] | Refusal:
        """:meth:`idempotent` for coroutines (the same steps, driven in the task)."""
        ran: list[bool] = []

        async def run(_: str) -> dict[str, Any]:
            return await drive_async(_produced(ran), produce)  # type: ignore[no-any-return]

        idem, steps = self._idempotent(request, ran)
        call = partial(idem.call_async, run, fingerprint(request, body))
        return await drive_async(steps, call)  # type: ignore[no-any-return]

    def _idempotent(
        self, request: Inbound, ran: list[bool]
    ) -> tuple[Idempotency, Generator[Step, Any, tuple[Captured, bool] | Refusal]]:
        """The idempotency policy, and the steps around its call (:data:`CALL`): the request's
        key set for the call, a refusal for a rejection, ``(answer, replayed)`` otherwise."""
        idem = self.idempotency
        key = self.idempotency_key(request)
        assert idem is not None
        assert key is not None

        def steps() -> Generator[Step, Any, tuple[Captured, bool] | Refusal]:
            token = _IDEMPOTENCY_KEY.set(key)
            try:
                stored = yield CALL
            except _Unstored as unstored:
                return unstored.captured, False
            except RejectedError as error:
                return self._refuse(error, [])
            finally:
                _IDEMPOTENCY_KEY.reset(token)
            return _replayed(stored, bool(ran))

        return idem, steps()


def _produced(ran: list[bool]) -> Generator[Step, Any, dict[str, Any]]:
    """The handler's run under an idempotency key (:data:`CALL` produces its answer): noted in
    ``ran``, its own calls free of the key (they are other writes), stored only below 500."""
    ran.append(True)
    token = _IDEMPOTENCY_KEY.set(None)
    try:
        captured = yield CALL
    finally:
        _IDEMPOTENCY_KEY.reset(token)
    if captured.status >= 500:
        raise _Unstored(captured)
    return captured.encode()  # type: ignore[no-any-return]


def _replayed(stored: Mapping[str, Any], ran: bool) -> tuple[Captured, bool]:
    captured = Captured.decode(stored)
    if not ran:
        captured.headers = [
            (name, value)
            for name, value in captured.headers
            if name.lower() not in _SKIPPED_ON_REPLAY
        ]
    return captured, not ran


def _rate_limited(limit: RateLimit, decision: Decision) -> RateLimitedError:
    window = limit.limiter.window
    per = f" per {window:g}s" if window is not None else ""
    route = f" on {limit.route}" if limit.route is not None else ""
    retry = decision[3]
    return RateLimitedError(
        limit.limiter.name,
        f"rate limit of {decision[4]}{per}{route} exceeded",
        None if retry == INF else retry,
    )


def _expired() -> RejectedError:
    return TimeoutExceeded("deadline", 0.0, "the caller's deadline passed before it was served")
