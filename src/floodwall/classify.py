"""Which failures a retry can fix: the three error classes, HTTP statuses and ``Retry-After``.

A retry helps only when the next attempt may go differently. The seeds sort failures into three
classes, and :class:`Classifier` puts every exception (and every result flagged as failed) in
one of them, or in :attr:`ErrorClass.UNKNOWN`:

* **business** errors (bad input, not found, declined payment, HTTP 4xx except 408/425/429):
  the same request gives the same answer; never retried.
* **overload** signals (HTTP 429 and 503, :class:`~floodwall.CircuitOpenError`,
  :class:`~floodwall.RateLimitedError`, :class:`~floodwall.BulkheadFullError`, any other
  floodwall rejection except a timeout): the dependency asked for less traffic; retrying now
  adds to the overload. Not retried by default, or only after their ``retry_after``.
* **transient** network errors (:class:`ConnectionError`, :class:`TimeoutError` including
  :class:`~floodwall.TimeoutExceeded`, HTTP 408/425/500/502/504): random, likely gone on the
  next attempt; retried with backoff. So are the HTTP clients' and gRPC's own transient
  errors: httpx's ``TimeoutException``/``NetworkError``/``RemoteProtocolError``, requests'
  ``ConnectionError``/``Timeout``, aiohttp's ``ClientConnectionError`` (and its
  ``ServerTimeoutError``), and a ``grpc.RpcError`` whose code is ``UNAVAILABLE`` or
  ``DEADLINE_EXCEEDED`` (``RESOURCE_EXHAUSTED`` is an overload signal). Those libraries are
  looked up in :data:`sys.modules`, never imported: an error of a library nobody imported
  cannot have been raised.

HTTP statuses are read by duck typing, so no HTTP client is imported: an exception or result
with an integer ``status_code`` or ``status`` attribute (httpx and requests responses, aiohttp's
``ClientResponseError``, ``http.client`` responses), or with a ``response`` attribute that has
one (httpx's ``HTTPStatusError``, requests' ``HTTPError``). ``Retry-After`` comes from a
floodwall rejection's ``retry_after``, a numeric ``retry_after`` attribute, or a
``Retry-After`` header (delta-seconds or an HTTP-date, RFC 9110 §10.2.3).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from floodwall._core.errors import (
    BulkheadFullError,
    CircuitOpenError,
    ConfigError,
    RateLimitedError,
    RejectedError,
)
from floodwall._core.outcome import ErrorClass
from floodwall._core.validate import count, exception_types, flag, function

__all__ = [
    "DEFAULT_CLASSIFIER",
    "Classifier",
    "ErrorClass",
    "http_status",
    "parse_retry_after",
    "retry_after_of",
]


BUSINESS_STATUSES = frozenset(range(400, 500)) - {408, 425, 429}
OVERLOAD_STATUSES = frozenset({429, 503})
TRANSIENT_STATUSES = frozenset({408, 425, 500, 502, 504})

_Types = tuple[type[BaseException], ...]

_LIBRARY_TRANSIENT = {
    "httpx": ("TimeoutException", "NetworkError", "RemoteProtocolError"),
    "requests": ("ConnectionError", "Timeout"),
    "aiohttp": ("ClientConnectionError", "ServerTimeoutError"),
}
"""Each HTTP client's transient error types, by top-level name (resolved when imported)."""
_GRPC_CLASSES = {"UNAVAILABLE": 0, "DEADLINE_EXCEEDED": 0, "RESOURCE_EXHAUSTED": 1}
"""gRPC status names and the :class:`ErrorClass` value they mean (the others: no opinion)."""
_resolved: dict[str, _Types] = {}


def library_transient() -> _Types:
    """The transient error types of the HTTP clients imported so far (none is imported here)."""
    found: _Types = ()
    for name, attributes in _LIBRARY_TRANSIENT.items():
        types = _resolved.get(name)
        if types is None:
            module = sys.modules.get(name)
            if module is None:
                continue
            types = tuple(
                kind
                for kind in (getattr(module, attribute, None) for attribute in attributes)
                if isinstance(kind, type) and issubclass(kind, BaseException)
            )
            _resolved[name] = types
        found += types
    return found


def _grpc_class(exc: BaseException) -> ErrorClass | None:
    """The class of a ``grpc.RpcError`` by its status code, read by duck typing."""
    grpc = sys.modules.get("grpc")
    rpc_error = getattr(grpc, "RpcError", None) if grpc is not None else None
    if not (isinstance(rpc_error, type) and isinstance(exc, rpc_error)):
        return None
    code = getattr(exc, "code", None)
    try:
        status = code() if callable(code) else None
    except (AttributeError, TypeError, ValueError):  # a grpc error without a call attached
        return None
    value = _GRPC_CLASSES.get(getattr(status, "name", ""))
    return None if value is None else ErrorClass(value)


def http_status(obj: object) -> int | None:
    """The HTTP status carried by an exception or response (see [Retries][guide-retries])."""
    for candidate in (obj, getattr(obj, "response", None)):
        if candidate is None:
            continue
        for attribute in ("status_code", "status"):
            status = getattr(candidate, attribute, None)
            if isinstance(status, int) and not isinstance(status, bool):
                return status
    return None


def parse_retry_after(value: str, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value, ``now`` being the wall-clock time
    (seconds since the epoch) for the HTTP-date form; ``None`` when unparseable. Never negative.
    """
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


def _header(obj: object) -> str | None:
    for candidate in (obj, getattr(obj, "response", None)):
        headers = getattr(candidate, "headers", None)
        if isinstance(headers, Mapping):
            for name in ("Retry-After", "retry-after"):
                value = headers.get(name)
                if isinstance(value, str | bytes):
                    return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def _statuses(name: str, value: object) -> frozenset[int]:
    """HTTP status codes as a frozenset: a collection of integers in [100, 599]."""
    if isinstance(value, str | bytes) or not isinstance(value, Collection):
        raise ConfigError(f"{name} must be a collection of HTTP status codes, got {value!r}")
    for status in value:
        count(f"{name} items", status, 100, 599)
    return frozenset(value)


def retry_after_of(obj: object, wall_clock: Callable[[], float] = time.time) -> float | None:
    """Seconds after which the dependency invites another try, or ``None`` when it said nothing.

    ``wall_clock`` is read only to turn an HTTP-date header into seconds.
    """
    if isinstance(obj, RejectedError):
        return obj.retry_after
    seconds = getattr(obj, "retry_after", None)
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return max(0.0, float(seconds)) if not math.isnan(seconds) else None
    header = _header(obj)
    return None if header is None else parse_retry_after(header, wall_clock())


@dataclass(frozen=True, slots=True)
class Classifier:
    """Sorts failures into :class:`ErrorClass` (first match wins, in this order):

    1. an instance of ``business`` → BUSINESS;
    2. an instance of ``overload``, or any other floodwall :class:`~floodwall.RejectedError`
       that is not a :class:`TimeoutError` → OVERLOAD;
    3. an HTTP status (see :func:`http_status`) in ``overload_statuses``, ``business_statuses``
       or ``transient_statuses`` → that class;
    4. an instance of ``transient``, or (with ``libraries=True``, the default) one of the HTTP
       clients' transient errors or a gRPC error by its code → that class;
    5. anything else → UNKNOWN.

    A result flagged as failed by ``Retry(retry_on_result=...)`` is classified by its HTTP
    status when it has one, else TRANSIENT (the predicate said a retry may help).

    Extend it with :func:`dataclasses.replace` or :meth:`with_types`, or subclass it and
    override :meth:`classify`.
    """

    business: _Types = ()
    overload: _Types = (CircuitOpenError, RateLimitedError, BulkheadFullError)
    transient: _Types = (ConnectionError, TimeoutError)
    business_statuses: frozenset[int] = BUSINESS_STATUSES
    overload_statuses: frozenset[int] = OVERLOAD_STATUSES
    transient_statuses: frozenset[int] = TRANSIENT_STATUSES
    libraries: bool = True
    """Classify the HTTP clients' and gRPC transient errors ([Retries][guide-retries])."""
    wall_clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)
    """Read only to turn an HTTP-date ``Retry-After`` into seconds."""

    def __post_init__(self) -> None:
        for name in ("business", "overload", "transient"):
            object.__setattr__(self, name, exception_types(name, getattr(self, name)))
        for name in ("business_statuses", "overload_statuses", "transient_statuses"):
            object.__setattr__(self, name, _statuses(name, getattr(self, name)))
        flag("libraries", self.libraries)
        function("wall_clock", self.wall_clock, what="a callable returning the wall-clock time")

    def classify(self, exc: BaseException) -> ErrorClass:
        """The class of an exception."""
        if self.business and isinstance(exc, self.business):
            return ErrorClass.BUSINESS
        if isinstance(exc, self.overload) or (
            isinstance(exc, RejectedError) and not isinstance(exc, TimeoutError)
        ):
            return ErrorClass.OVERLOAD
        by_status = self._by_status(exc)
        if by_status is not None:
            return by_status
        if isinstance(exc, self.transient):
            return ErrorClass.TRANSIENT
        if self.libraries:
            if isinstance(exc, library_transient()):
                return ErrorClass.TRANSIENT
            by_code = _grpc_class(exc)
            if by_code is not None:
                return by_code
        return ErrorClass.UNKNOWN

    def classify_result(self, result: object) -> ErrorClass:
        """The class of a result that a predicate flagged as failed."""
        by_status = self._by_status(result)
        return ErrorClass.TRANSIENT if by_status is None else by_status

    def _by_status(self, obj: object) -> ErrorClass | None:
        status = http_status(obj)
        if status is None:
            return None
        if status in self.overload_statuses:
            return ErrorClass.OVERLOAD
        if status in self.business_statuses:
            return ErrorClass.BUSINESS
        if status in self.transient_statuses:
            return ErrorClass.TRANSIENT
        return None

    def retry_after(self, obj: object) -> float | None:
        """:func:`retry_after_of` with this classifier's wall clock."""
        return retry_after_of(obj, self.wall_clock)

    def with_types(
        self,
        *,
        business: _Types = (),
        overload: _Types = (),
        transient: _Types = (),
    ) -> Classifier:
        """A copy whose type lists are extended by the given ones."""
        return dataclasses.replace(
            self,
            business=self.business + business,
            overload=self.overload + overload,
            transient=self.transient + transient,
        )


DEFAULT_CLASSIFIER = Classifier()
"""The built-in classes described in [Retries][guide-retries]."""


def _describe(exc: BaseException | None, result: Any) -> str:
    """A short name for what failed, for event reasons and notes."""
    if exc is None:
        status = http_status(result)
        return f"result {result!r}" if status is None else f"result with HTTP status {status}"
    status = http_status(exc)
    name = type(exc).__name__
    return name if status is None else f"{name} (HTTP {status})"
