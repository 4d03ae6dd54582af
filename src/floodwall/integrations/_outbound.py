"""The outbound core every client integration shares: routing, classification, wire headers.

A client shell (httpx transport, aiohttp middleware, requests adapter, gRPC interceptor) turns one
request into one :class:`Call` (:meth:`Outbound.begin`) and hands it an *attempt* function that
sends the request once. The call runs the attempt through the request's policy (a resource of a
:class:`~floodwall.config.Registry`, or any :class:`~floodwall.Policy`), and the attempt asks the
call three things:

* :meth:`Call.headers` and :meth:`Call.attempt_timeout`: what to put on the wire for this
  attempt (the time left minus the margin, the retry marker, the priority, the idempotency key)
  and how long to wait for it (the time left);
* :meth:`Call.check` with the answer's status and headers: ``None`` for an answer to hand back,
  or an exception to raise *inside* the pipeline so the breaker counts it and the retry
  classifies it (5xx, 408, 429 by default; ``Retry-After`` honoured);
* :meth:`Call.connect_error` / :meth:`Call.timeout_error` / :meth:`Call.io_error` with a client
  library's exception: the same, as a :class:`ConnectionError` or :class:`TimeoutError` the
  classifier knows.

Whether a failure may be retried is decided here, per request: idempotent methods (RFC 9110
§9.2.2) and requests carrying an ``Idempotency-Key`` may be; any request whose connection never
opened may be (nothing reached the server); anything else is raised as a failure the retry
classifies as not retryable, and the breaker still counts. So are answers whose sender says
``X-Retry-Pushback-Ms: -1`` (it retried below already).

When the pipeline gives up, :meth:`Call.run` hands back the last failed answer (a 503 stays a
503 response) or re-raises the client library's own exception, with the retry's notes; floodwall
rejections (open breaker, full bulkhead, timeout) propagate as themselves. An inbound request
being served learns (through its :class:`~floodwall.integrations._wire.Hop`) that a call of its
own was retried below, so its failure answer says so upstream.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Final, Protocol, TypedDict, TypeVar, Unpack

from floodwall import context as _context
from floodwall._core import validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, OverloadedError, TimeoutExceeded
from floodwall._core.policy import Policy
from floodwall.classify import parse_retry_after
from floodwall.context import (
    CallContext,
    current_call,
    idempotency_key,
    remaining,
)
from floodwall.integrations import _wire
from floodwall.integrations._wire import (
    ADMISSION_LEVEL,
    DEADLINE,
    DEADLINE_MARGIN,
    IDEMPOTENCY_KEY,
    PRIORITY,
    RETRY_ATTEMPT,
    RETRY_PUSHBACK,
    format_degraded,
    format_level,
    parse_level,
    parse_pushback,
)
from floodwall.pipeline import answering
from floodwall.retry import _RECORD, gave_up

# Assigned, not imported by name: CPython 3.11 calls a method of an import-bound name through
# a bound method made per call (docs/gateway.md, "A fifth pass").
_CALL = _context._CALL
_DEADLINE = _context._DEADLINE
_IDEMPOTENCY_KEY = _context._IDEMPOTENCY_KEY
_REQUEST = _context._REQUEST
_RETRY = _context._RETRY
_HOP = _wire._HOP
_PRIORITY = _wire._PRIORITY

__all__ = [
    "FAILURE_STATUSES",
    "IDEMPOTENT_METHODS",
    "AdmissionLevels",
    "Call",
    "Outbound",
    "OutboundOptions",
    "ResourceSource",
]

R = TypeVar("R")

IDEMPOTENT_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""RFC 9110 §9.2.2: methods whose repetition has the effect of one request."""
FAILURE_STATUSES: Final = frozenset({408, 425, 429, *range(500, 600)})
"""Answers counted as failures by breakers and offered to retries (the classifier still sorts
them: 503/429 are overload signals, retried only with ``retry_overload`` and a Retry-After)."""
ADMISSION_TTL: Final = 1.0
"""Seconds a server's reported admission level is trusted (DAGOR's window): past it, requests
go out again and bring the current level back."""
MIN_ATTEMPT_TIMEOUT: Final = 0.001


class ResourceSource(Protocol):
    """Where named policies come from: a :class:`~floodwall.config.Registry` (duck-typed, so the
    integrations do not import the config layer and its pydantic dependency)."""

    def get(self, name: str) -> Policy: ...

    def names(self) -> list[str]: ...


# -- failures raised inside the pipeline ----------------------------------------------------------


class _AttemptError(Exception):
    """An attempt's failure as the pipeline sees it; :meth:`Call.run` unwraps it again."""

    answer: Any = None
    """The failed response (handed back when the pipeline gives up), or None."""
    original: BaseException | None = None
    """The client library's exception (re-raised when the pipeline gives up), or None."""
    final: bool = False
    """The sender said not to retry (it retried below)."""
    reason: str = "upstream_error"
    """What went wrong, in the gateway's words (``upstream_5xx``, ``upstream_unavailable``,
    ``timeout``): the ``reason`` of the ``X-Degraded`` answer a fallback gives for it."""


class _StatusError(_AttemptError):
    """A failed answer the retry may retry: ``status_code`` and ``retry_after`` classify it."""

    def __init__(self, text: str, status: int, retry_after: float | None, answer: Any) -> None:
        super().__init__(text)
        self.status_code = status
        self.retry_after = retry_after
        self.answer = answer


class _ConnectError(_AttemptError, ConnectionError):
    """A connection error: transient."""

    def __init__(self, text: str, original: BaseException) -> None:
        super().__init__(text)
        self.original = original


class _AttemptTimeoutError(_AttemptError, TimeoutError):
    """A timeout waiting for the answer: transient (for a request that may be repeated)."""

    def __init__(self, text: str, original: BaseException) -> None:
        super().__init__(text)
        self.original = original


class _UnretryableError(_AttemptError):
    """A failure the classifier files as unknown (not retried); breakers still count it."""

    def __init__(
        self, text: str, *, answer: Any = None, original: BaseException | None = None
    ) -> None:
        super().__init__(text)
        self.answer = answer
        self.original = original


# -- DAGOR collaboration --------------------------------------------------------------------------


class AdmissionLevels:
    """The admission level each upstream last reported (``X-Admission-Level``), for early
    shedding: a request whose priority is below a server's level is refused locally with
    :class:`~floodwall.OverloadedError` instead of being sent to be shed there. A level is
    trusted for ``ttl`` seconds (the same memory as :class:`floodwall.adaptive.UpstreamLevels`,
    plus an expiry so a recovered server is asked again)."""

    def __init__(self, *, ttl: float = ADMISSION_TTL, clock: Clock = SYSTEM_CLOCK) -> None:
        self.ttl = validate.seconds("admission_ttl", ttl, positive=True)
        self.clock = clock
        self._levels: dict[str, tuple[tuple[int, int], float]] = {}

    def update(self, service: str, level: tuple[int, int]) -> None:
        self._levels[service] = (level, self.clock.monotonic() + self.ttl)

    def get(self, service: str) -> tuple[int, int] | None:
        """The level ``service`` reported, if still trusted."""
        entry = self._levels.get(service)
        if entry is None:
            return None
        if entry[1] <= self.clock.monotonic():
            self._levels.pop(service, None)
            return None
        return entry[0]

    def check(self, service: str, priority: tuple[int, int]) -> None:
        """Raise :class:`~floodwall.OverloadedError` if ``service`` would shed ``priority``."""
        level = self.get(service)
        if level is not None and priority > level:
            raise OverloadedError(
                service,
                f"priority {format_level(priority)} is below the admission level "
                f"{format_level(level)} it reported (shed early, DAGOR)",
                self.ttl,
            )


# -- routing ----------------------------------------------------------------------------------


Route = Policy | str


def _route_key(pattern: str) -> tuple[str | None, int | None, str]:
    """``host``, ``host:port``, ``host/prefix``, ``/prefix`` or ``*`` → (host, port, prefix)."""
    if pattern == "*":
        return None, None, "/"
    head, slash, tail = pattern.partition("/")
    prefix = "/" + tail if slash else "/"
    if not head:
        return None, None, prefix
    host, colon, port = head.rpartition(":") if ":" in head else (head, "", "")
    if colon and not port.isdigit():
        raise ConfigError(f"routes: bad port in {pattern!r}")
    return host.lower(), int(port) if colon else None, prefix


class OutboundOptions(TypedDict, total=False):
    """The keyword options every client integration takes (see :class:`Outbound`)."""

    registry: ResourceSource | None
    routes: Mapping[str, Route] | None
    margin: float
    idempotent_methods: frozenset[str]
    failure_statuses: frozenset[int]
    admission: bool
    admission_ttl: float
    clock: Clock


class Outbound:
    """The outbound core (see [Integrations][guide-integrations]).

    Which policy guards a request, first match wins:

    1. ``routes``: patterns ``"host"``, ``"host:port"``, ``"host/path-prefix"``,
       ``"/path-prefix"`` or ``"*"``, most specific first, each naming a resource of
       ``registry`` or giving a :class:`~floodwall.Policy`;
    2. the ``registry`` resource named like the request's host, if there is one;
    3. ``policy`` (default: none: the request is sent unprotected, but the wire headers, the
       deadline and early shedding still apply).

    ``margin`` (seconds, default 10 ms) is taken off the time left before it is sent as
    ``X-Request-Deadline``. ``admission=False`` turns DAGOR early shedding off.
    """

    def __init__(self, policy: Policy | None = None, **options: Unpack[OutboundOptions]) -> None:
        registry = options.get("registry")
        routes = options.get("routes")
        margin = options.get("margin", DEADLINE_MARGIN)
        clock = options.get("clock", SYSTEM_CLOCK)
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a floodwall Policy, got {policy!r}")
        validate.seconds("margin", margin)
        self.policy = policy
        self.registry = registry
        self.margin = float(margin)
        methods = options.get("idempotent_methods", IDEMPOTENT_METHODS)
        self.idempotent_methods = frozenset(m.upper() for m in methods)
        self.failure_statuses = frozenset(options.get("failure_statuses", FAILURE_STATUSES))
        ttl = options.get("admission_ttl", ADMISSION_TTL)
        admission = options.get("admission", True)
        self.levels = AdmissionLevels(ttl=ttl, clock=clock) if admission else None
        self.clock = clock
        self._routes = self._compile(routes or {})
        self._known = frozenset(registry.names()) if registry is not None else frozenset()

    def _compile(
        self, routes: Mapping[str, Route]
    ) -> list[tuple[str | None, int | None, str, Route]]:
        table = []
        for pattern, target in routes.items():
            if isinstance(target, str):
                if self.registry is None:
                    raise ConfigError(f"routes[{pattern!r}] names {target!r} but no registry given")
                self.registry.get(target)  # KeyError naming the known resources
            elif not isinstance(target, Policy):
                raise ConfigError(f"routes[{pattern!r}] must be a resource name or a Policy")
            table.append((*_route_key(pattern), target))
        # Most specific first: a host beats none, a port beats none, a longer prefix wins.
        table.sort(key=lambda r: (r[0] is None, r[1] is None, -len(r[2])))
        return table

    def resolve(self, host: str, port: int | None, path: str) -> Policy | None:
        """The policy guarding a request to ``host:port/path`` (see the class docstring)."""
        host = host.lower()
        for r_host, r_port, prefix, target in self._routes:
            if (
                (r_host is None or r_host == host)
                and (r_port is None or r_port == port)
                and path.startswith(prefix)
            ):
                return self._named(target)
        if host in self._known:
            return self._named(host)
        return self.policy

    def _named(self, target: Route) -> Policy | None:
        if not isinstance(target, str):
            return target
        assert self.registry is not None
        try:
            return self.registry.get(target)
        except KeyError:  # removed by a reload: drained, not an error for the caller
            return self.policy

    def begin(
        self, method: str, host: str, port: int | None, path: str, key: str | None = None
    ) -> Call:
        """One request's call: ``key`` is its ``Idempotency-Key`` header, if it has one."""
        method = method.upper()
        service = f"{host}:{port}" if port is not None else host
        return Call(self, method, service, self.resolve(host, port, path), key)


_ADMISSION_LEVEL: Final = ADMISSION_LEVEL.lower()
"""The field read from every answer, lower-cased once (not a new string per answer)."""


class Call(CallContext):
    """One outbound request through its policy (see [Integrations][guide-integrations]).

    It is its own :class:`~floodwall.CallContext` while the policy runs, so a fallback's
    ``degraded_by`` and ``degraded_reason`` land on it (no extra object per request).
    """

    __slots__ = (
        "_ambient_key",
        "core",
        "failure",
        "key",
        "method",
        "policy",
        "record",
        "retryable",
        "service",
    )

    def __init__(
        self, core: Outbound, method: str, service: str, policy: Policy | None, key: str | None
    ) -> None:
        self.core = core
        self.method = method
        self.service = service
        self.policy = policy
        self.key = key
        # (the ambient values read from their variables, here and below: a Python call less
        # each, per outbound request; the ambient key only for a method that needs one)
        unsafe = method not in core.idempotent_methods
        self._ambient_key = _IDEMPOTENCY_KEY.get() if unsafe and key is None else None
        self.retryable = not unsafe or key is not None or self._ambient_key is not None
        self.degraded_by: str | None = None
        self.degraded_reason: str | None = None
        self.failure: _AttemptError | None = None  # the last attempt's failure
        self.record = True
        """Whether the call is the open call record while its policy runs (the default). A
        caller that knows nothing inside notes a degradation (no fallback, cache or backup
        source in the policy, no code of the user's in the attempt) may clear it: then the
        policy runs without a context variable set and reset, and
        :func:`~floodwall.current_call` inside finds the inbound request's record."""

    # -- what an attempt sends -------------------------------------------------------------------

    def headers(self) -> list[tuple[str, str]]:
        """The wire headers for the attempt starting now."""
        out: list[tuple[str, str]] = []
        deadline = _DEADLINE.get()
        if deadline is not None:  # (deadline.remaining(), inline)
            left = deadline.at - deadline.clock.monotonic() - self.core.margin
            millis = math.floor(left * 1000)  # (format_deadline, inline: one call less)
            out.append((DEADLINE, str(millis) if millis > 0 else "0"))
        marker = _RETRY.get()
        if marker is not None:
            out.append((RETRY_ATTEMPT, str(marker.attempt)))
        level = _PRIORITY.get()
        if level is not None:
            out.append((PRIORITY, format_level(level)))
        if self._ambient_key is not None:
            out.append((IDEMPOTENCY_KEY, self._ambient_key))
        return out

    def attempt_timeout(self) -> float | None:
        """Seconds this attempt may wait: the time left before the ambient deadline."""
        left = remaining()
        return None if left is None else max(left, MIN_ATTEMPT_TIMEOUT)

    # -- what an attempt got ---------------------------------------------------------------------

    def check(
        self, status: int, header: Callable[[str], str | None], answer: Any
    ) -> _AttemptError | None:
        """``None`` if the answer is handed back as is, else the failure to raise (the caller
        reads or releases the answer's body first, so a retry does not hold its connection).
        Notes the dependency's admission level the answer carries, if any."""
        levels = self.core.levels
        if levels is not None:
            raw_level = header(_ADMISSION_LEVEL)
            level = None if raw_level is None else parse_level(raw_level)
            if level is not None:
                levels.update(self.service, level)
        if status not in self.core.failure_statuses:
            return None  # (the usual answer: no call past this one)
        failure = self._status_failure(status, header, answer)
        return self._failed(failure, "upstream_5xx" if status >= 500 else f"upstream_{status}")

    def _failed(self, failure: _AttemptError, reason: str) -> _AttemptError:
        failure.reason = reason
        self.failure = failure
        return failure

    def _status_failure(
        self, status: int, header: Callable[[str], str | None], answer: Any
    ) -> _AttemptError:
        """The failure of an answer whose ``status`` is a failure status."""
        text = f"HTTP {status} from {self.service}"
        pushback = parse_pushback(header(RETRY_PUSHBACK.lower()))
        if pushback is not None and pushback < 0:
            failure = _UnretryableError(text + " (retried below: not retried again)", answer=answer)
            failure.final = True
            return failure
        if not self.retryable:
            return _UnretryableError(text + f" ({self._why_not()})", answer=answer)
        retry_after = None
        raw = header("retry-after")
        if raw is not None:
            retry_after = parse_retry_after(raw, self._wall())
        if pushback is not None:
            retry_after = max(retry_after or 0.0, pushback)
        return _StatusError(text, status, retry_after, answer)

    def _why_not(self) -> str:
        return f"{self.method} without an Idempotency-Key is not retried"

    @staticmethod
    def _wall() -> float:
        return time.time()

    def connect_error(self, exc: BaseException) -> _AttemptError:
        """The connection never opened: retryable whatever the method."""
        failure = _ConnectError(f"cannot connect to {self.service}: {exc!r}", exc)
        return self._failed(failure, "upstream_unavailable")

    def timeout_error(self, exc: BaseException) -> _AttemptError:
        """No (complete) answer in time: retryable if the request may be repeated."""
        text = f"no answer from {self.service} in time: {exc!r}"
        if not self.retryable:
            failure: _AttemptError = _UnretryableError(f"{text} ({self._why_not()})", original=exc)
        else:
            failure = _AttemptTimeoutError(text, exc)
        return self._failed(failure, "timeout")

    def io_error(self, exc: BaseException) -> _AttemptError:
        """The connection broke after the request went out: like a timeout."""
        text = f"connection to {self.service} failed: {exc!r}"
        if not self.retryable:
            failure: _AttemptError = _UnretryableError(f"{text} ({self._why_not()})", original=exc)
        else:
            failure = _ConnectError(text, exc)
        return self._failed(failure, "upstream_unavailable")

    # -- the drivers -----------------------------------------------------------------------------

    @staticmethod
    def _expired() -> bool:
        """Whether the request's deadline passed before it was sent: it is not sent, and only
        what can answer without the dependency runs (:meth:`_stand_in`)."""
        deadline = _DEADLINE.get()
        return deadline is not None and deadline.remaining() <= 0

    def _stand_in(self) -> Policy:
        """What answers a request that is not sent: the policy's fallback, cache or backup
        source (with a resource's meter); raises the deadline's error when there is none."""
        stand_in = answering(self.policy) if self.policy is not None else None
        if stand_in is None:
            raise self._late()
        return stand_in

    def _late(self) -> TimeoutExceeded:
        return TimeoutExceeded(self.service, 0.0, "the deadline passed before the request was sent")

    def _raise_late(self) -> Any:
        raise self._late()

    async def _raise_late_async(self) -> Any:
        raise self._late()

    def _before(self) -> contextvars.Token[str | None] | None:
        """Shed early against the dependency's level; set the call's idempotency key when it
        is not the ambient one (it lets ``Retry(idempotent=False)`` retry this write): the
        token to reset after the call, ``None`` when nothing was set (no ``with`` and no
        context manager per call)."""
        levels = self.core.levels
        if levels is not None:
            level = _PRIORITY.get()
            if level is not None:
                levels.check(self.service, level)
        key = self.key
        if key is not None and _IDEMPOTENCY_KEY.get() != key:
            return _IDEMPOTENCY_KEY.set(idempotency_key(key).key)  # (validated as in a `with`)
        return None

    def run(self, attempt: Callable[[], R]) -> R | Any:
        """Send with ``attempt`` under the policy; the answer, a fallback value, or raise.

        A request whose deadline already passed is not sent: the policy's fallback (cache,
        backup source; see :func:`~floodwall.pipeline.answering`) answers it if it has one,
        else :class:`~floodwall.TimeoutExceeded` is raised. Breakers, bulkheads and retries do
        not see it (the dependency did nothing); a resource's meter counts it as a timeout."""
        if self._expired():
            stand_in = self._stand_in()
            with self._answering():
                return stand_in.call(self._raise_late)
        keyed = self._before()
        policy = self.policy
        try:
            if policy is None:
                return attempt()
            if not self.record:
                return policy.call(attempt)
            token = _CALL.set((self, _REQUEST.get()))  # call_context(), with self as it
            try:
                return policy.call(attempt)
            finally:
                _CALL.reset(token)
                if self.degraded_by is not None:
                    self._pass_on()
        except _AttemptError as failure:
            return self._settle(failure)
        finally:
            if keyed is not None:
                _IDEMPOTENCY_KEY.reset(keyed)

    async def run_async(self, attempt: Callable[[], Awaitable[R]]) -> R | Any:
        """:meth:`run` for coroutines."""
        deadline = _DEADLINE.get()  # (self._expired() and self._before(), inline when they
        if deadline is not None and deadline.at - deadline.clock.monotonic() <= 0:  # have
            stand_in = self._stand_in()  # nothing to do: two calls less per outbound request)
            with self._answering():
                return await stand_in.call_async(self._raise_late_async)
        key, levels = self.key, self.core.levels
        quiet = key is None and (levels is None or _PRIORITY.get() is None)  # (nothing to check)
        keyed = None if quiet else self._before()
        policy = self.policy
        try:
            if policy is None:
                return await attempt()
            if not self.record:
                return await policy.call_async(attempt)
            token = _CALL.set((self, _REQUEST.get()))
            try:
                return await policy.call_async(attempt)
            finally:
                _CALL.reset(token)
                if self.degraded_by is not None:
                    self._pass_on()
        except _AttemptError as failure:
            return self._settle(failure)
        finally:
            if keyed is not None:
                _IDEMPOTENCY_KEY.reset(keyed)

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """This call as the open call context while a stand-in answers (``X-Degraded``)."""
        token = _CALL.set((self, _REQUEST.get()))
        try:
            yield
        finally:
            _CALL.reset(token)
            if self.degraded_by is not None:
                self._pass_on()

    def _pass_on(self) -> None:
        """Say why in the gateway's words, and tell the call around this one (the inbound
        request being served) that it was degraded too."""
        failure = self.failure
        if failure is not None and self.degraded_reason == type(failure).__name__:
            self.degraded_reason = failure.reason  # "upstream_5xx", not a private class's name
        outer = current_call()
        if outer is not None:
            outer.degraded_by, outer.degraded_reason = self.degraded_by, self.degraded_reason

    def degraded_value(self) -> str:
        """The ``X-Degraded`` value of a fallback's answer to this request (the same vocabulary
        as inbound middleware and the gateway: ``recommendations.fallback; reason=timeout``)."""
        if self.degraded_by is not None:
            return format_degraded(self.degraded_by, self.degraded_reason)
        return format_degraded(self.policy.name if self.policy is not None else "fallback")

    def _settle(self, failure: _AttemptError) -> Any:
        record = gave_up(failure)
        hop = _HOP.get()
        if hop is not None and (failure.final or (record is not None and record.final)):
            hop.final = True
        if failure.answer is not None:
            return failure.answer
        original = failure.original
        assert original is not None
        for note in getattr(failure, "__notes__", ()):
            original.add_note(note)
        if record is not None:
            with contextlib.suppress(AttributeError):
                setattr(original, _RECORD, record)
        try:
            raise original
        finally:
            del original, failure
