"""The one header set every integration (and the gateway) speaks, and how to read and write it.

Framework-free: names, parsers and formatters only, plus the two ambient values that exist only
because of the wire (the request's DAGOR priority and the per-request :class:`Hop` record).

==========================  =====================================================================
``X-Request-Deadline``       request: milliseconds the caller still waits (integer). The server
                             sets its ambient :func:`floodwall.deadline` from it; its own calls
                             send what remains minus a safety margin. ``grpc-timeout`` (gRPC's
                             ``8 digits + unit`` form) is read too.
``X-Retry-Attempt``          request: this is retry attempt *n* (>= 2) of a caller. The server
                             runs the request under :func:`floodwall.retry_marker`, so its own
                             outbound calls do not retry: one retrying layer per request.
``X-Retry-Pushback-Ms``      response: gRPC's ``grpc-retry-pushback-ms`` for HTTP. Negative: the
                             answering service already retried below (or its budget refused to):
                             do not retry this answer. Non-negative: wait at least that long.
``X-Request-Priority``       request: DAGOR compound priority ``business:user`` (0 = most
                             important), set at the edge and carried unchanged along the chain.
``X-Admission-Level``        response: a shedding server's DAGOR admission level
                             ``business:user``; callers shed lower-priority requests to it early.
``Idempotency-Key``          request: the logical write a request belongs to (IETF draft
                             ``draft-ietf-httpapi-idempotency-key-header``).
``Idempotent-Replayed``      response: ``true`` when the answer was replayed from the store.
``X-Degraded``               response: something answered instead of a dependency: its name,
                             then why and, for a stored answer, how old (whole seconds):
                             ``reviews.fallback; reason=timeout``,
                             ``cache; reason=circuit_open; age=12``. The same vocabulary from
                             inbound middleware, outbound clients and the gateway
                             (:func:`format_degraded`, :func:`parse_degraded`).
``X-Request-Start``          request: when a front proxy received it (``t=`` epoch seconds, ms
                             or µs), for the shedding guard's queueing time.
``RateLimit-*``,             response: ``RateLimit-Limit``/``-Remaining``/``-Reset``/``-Policy``
``Retry-After``              (IETF draft) and RFC 9110's ``Retry-After``, whole seconds.
==========================  =====================================================================

Rejections are answered as RFC 9457 problem details (``application/problem+json``) by
:func:`problem`: status from :data:`STATUS_OF_KIND`, ``kind`` and ``retry_after`` as extensions.
"""

from __future__ import annotations

import contextvars
import json
import math
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Final

from floodwall._core import validate
from floodwall._core.errors import RejectedError
from floodwall.context import _REQUEST

__all__ = [
    "ADMISSION_LEVEL",
    "DEADLINE",
    "DEADLINE_MARGIN",
    "DEGRADED",
    "GRPC_PUSHBACK",
    "GRPC_TIMEOUT",
    "IDEMPOTENCY_KEY",
    "IDEMPOTENT_REPLAYED",
    "PRIORITY",
    "PROBLEM_JSON",
    "REQUEST_START",
    "RETRY_AFTER",
    "RETRY_ATTEMPT",
    "RETRY_PUSHBACK",
    "STATUS_OF_KIND",
    "Hop",
    "current_hop",
    "current_priority",
    "format_deadline",
    "format_degraded",
    "format_grpc_timeout",
    "format_level",
    "parse_attempt",
    "parse_deadline",
    "parse_degraded",
    "parse_grpc_timeout",
    "parse_level",
    "parse_pushback",
    "parse_request_start",
    "priority",
    "problem",
    "rejection_status",
]

DEADLINE: Final = "X-Request-Deadline"
RETRY_ATTEMPT: Final = "X-Retry-Attempt"
RETRY_PUSHBACK: Final = "X-Retry-Pushback-Ms"
PRIORITY: Final = "X-Request-Priority"
ADMISSION_LEVEL: Final = "X-Admission-Level"
IDEMPOTENCY_KEY: Final = "Idempotency-Key"
IDEMPOTENT_REPLAYED: Final = "Idempotent-Replayed"
DEGRADED: Final = "X-Degraded"
REQUEST_START: Final = "X-Request-Start"
RETRY_AFTER: Final = "Retry-After"
GRPC_TIMEOUT: Final = "grpc-timeout"
GRPC_PUSHBACK: Final = "grpc-retry-pushback-ms"
PROBLEM_JSON: Final = "application/problem+json"

DEADLINE_MARGIN: Final = 0.010
"""Seconds subtracted from the time left before it is sent downstream: the answer's way back
(and the serialisation on both ends) must fit in what the caller still waits."""

MAX_DEADLINE: Final = 24 * 3600.0
"""Seconds: a received deadline above this is read as no deadline (a unit mix-up, not a budget)."""

STATUS_OF_KIND: Final[Mapping[str, int]] = {
    "rate_limited": 429,
    "overloaded": 503,
    "circuit_open": 503,
    "bulkhead_full": 503,
    "degraded": 503,
    "retry_budget_exhausted": 503,
    "idempotency_unavailable": 503,
    "store_unavailable": 503,
    "timeout": 504,
    "duplicate_in_flight": 409,
    "idempotency_token_used": 409,
    "idempotency_key_reused": 422,
    "idempotency_key_missing": 400,
}
"""The HTTP status answering each rejection kind (anything else: 503)."""

_TITLES: Final[Mapping[int, str]] = {
    400: "Bad Request",
    409: "Conflict",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

# -- deadlines ----------------------------------------------------------------------------------


def format_deadline(seconds: float) -> str:
    """``X-Request-Deadline`` for ``seconds`` left: whole milliseconds, rounded down (a callee is
    never promised more time than the caller waits), never negative."""
    millis = math.floor(seconds * 1000)
    return str(millis) if millis > 0 else "0"  # (not max(): a slow builtin call, per request)


def parse_deadline(value: str | bytes | None) -> float | None:
    """Seconds from an ``X-Request-Deadline`` value (milliseconds, integer or decimal); ``None``
    when absent, malformed, negative, or above :data:`MAX_DEADLINE`."""
    if value is None:
        return None
    try:
        millis = float(value)
    except ValueError:
        return None
    seconds = millis / 1000
    if not 0 <= seconds <= MAX_DEADLINE:  # also rejects NaN
        return None
    return seconds


_GRPC_UNITS: Final[Mapping[str, float]] = {
    "H": 3600.0,
    "M": 60.0,
    "S": 1.0,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}


def parse_grpc_timeout(value: str | bytes | None) -> float | None:
    """Seconds from a ``grpc-timeout`` value (1–8 ASCII digits and a unit ``HMSmun``, gRPC over
    HTTP/2 spec); ``None`` when absent or malformed."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    digits, unit = text[:-1], text[-1:]
    scale = _GRPC_UNITS.get(unit)
    if scale is None or not 1 <= len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * scale


def format_grpc_timeout(seconds: float) -> str:
    """``grpc-timeout`` for ``seconds``: the finest unit whose value fits 8 digits, rounded down."""
    seconds = max(0.0, seconds)
    for unit, scale in (("n", 1e-9), ("u", 1e-6), ("m", 1e-3), ("S", 1.0), ("M", 60.0)):
        count = math.floor(seconds / scale)
        if count < 100_000_000:
            return f"{count}{unit}"
    return f"{min(99_999_999, math.floor(seconds / 3600))}H"


# -- retries -----------------------------------------------------------------------------------


def parse_attempt(value: str | bytes | None) -> int | None:
    """The retry attempt from ``X-Retry-Attempt``: an integer >= 2, else ``None`` (attempt 1,
    absent or malformed values mean "not a retry")."""
    if value is None:
        return None
    try:
        attempt = int(value)
    except ValueError:
        return None
    return attempt if attempt >= 2 else None


def parse_pushback(value: str | bytes | None) -> float | None:
    """``X-Retry-Pushback-Ms`` / ``grpc-retry-pushback-ms`` as seconds: ``-1.0`` for "do not
    retry" (negative or unparseable, as gRPC reads it), else the wait; ``None`` when absent."""
    if value is None:
        return None
    try:
        millis = int(value)
    except ValueError:
        return -1.0
    return -1.0 if millis < 0 else millis / 1000


# -- DAGOR priority and admission level --------------------------------------------------------


def format_degraded(source: str, reason: str | None = None, age: float | None = None) -> str:
    """The ``X-Degraded`` value: ``source`` (what answered: a fallback's name, ``cache``,
    ``static``, ``backup``), ``reason`` (the rejection kind or exception type it answered for)
    and ``age`` (seconds since a stored answer was fresh, whole): ``"cache; reason=timeout;
    age=12"``. One item of an RFC 8941 list: several degraded dependencies join with ``", "``."""
    text = source if reason is None else f"{source}; reason={reason}"
    return text if age is None else f"{text}; age={int(age)}"


def parse_degraded(value: str | bytes | None) -> list[tuple[str, dict[str, str]]]:
    """Every ``(source, {parameter: value})`` of an ``X-Degraded`` value (``[]`` for none):
    ``"cache; reason=timeout; age=12"`` gives ``[("cache", {"reason": "timeout", "age": "12"})]``.
    """
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    items: list[tuple[str, dict[str, str]]] = []
    for item in (value or "").split(","):
        source, *params = (part.strip() for part in item.split(";"))
        if source:
            pairs = (param.partition("=") for param in params if param)
            items.append((source, {name.strip(): text.strip() for name, _, text in pairs}))
    return items


def format_level(level: tuple[int, int]) -> str:
    """``business:user`` for ``X-Admission-Level`` and ``X-Request-Priority``."""
    return f"{level[0]}:{level[1]}"


def parse_level(value: str | bytes | None) -> tuple[int, int] | None:
    """``(business, user)`` from ``business:user`` (non-negative integers), else ``None``."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    business, sep, user = text.partition(":")
    if not sep or not business.strip().isdigit() or not user.strip().isdigit():
        return None
    return int(business), int(user)


_PRIORITY: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "floodwall_priority", default=None
)


def current_priority() -> tuple[int, int] | None:
    """The ambient DAGOR priority ``(business, user)``, or ``None`` (treated as ``(0, 0)``)."""
    return _PRIORITY.get()


class priority:  # noqa: N801 - used like a function, in `with`
    """Context manager (sync and async) giving everything inside the DAGOR priority
    ``(business, user)`` (0 = most important). Inbound integrations set it from
    ``X-Request-Priority``; outbound ones send it and shed early against a server's level."""

    __slots__ = ("_token", "level")

    def __init__(self, business: int, user: int = 0) -> None:
        for name, value in (("business", business), ("user", user)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        self.level = (business, user)
        self._token: contextvars.Token[tuple[int, int] | None] | None = None

    def __enter__(self) -> tuple[int, int]:
        self._token = _PRIORITY.set(self.level)
        return self.level

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            _PRIORITY.reset(self._token)
            self._token = None

    async def __aenter__(self) -> tuple[int, int]:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, exc, tb)


# -- the per-request record --------------------------------------------------------------------


class Hop:
    """What happened to one inbound request's own outbound calls, for its response headers.

    ``final`` is set when an outbound call gave up after retrying, or its retry budget refused
    to retry, or the callee said not to retry: the request is already retried as much as it
    will be, and a failure answer carries ``X-Retry-Pushback-Ms: -1`` so the caller does not
    retry it again (the cross-process form of "retried below").

    The inbound guard's :class:`~floodwall.integrations._inbound.Admission` is itself the Hop
    of its request and carries its call record (``call``): one ambient value per request.
    """

    __slots__ = ("final",)

    def __init__(self, final: bool = False) -> None:
        self.final = validate.flag("final", final, error=ValueError)

    def __repr__(self) -> str:
        return f"Hop(final={self.final})"


_HOP: contextvars.ContextVar[Hop | None] = _REQUEST
"""The inbound request being served: :mod:`floodwall.context` reads it to find the call record
of an admitted request (:func:`floodwall.current_call`)."""


def current_hop() -> Hop | None:
    """The :class:`Hop` of the inbound request being served, or ``None`` outside one."""
    return _HOP.get()


# -- queueing time -----------------------------------------------------------------------------


def parse_request_start(value: str | bytes | None, wall_now: float) -> float | None:
    """Seconds a request queued since a front proxy stamped ``X-Request-Start`` (``t=`` optional;
    epoch seconds, milliseconds or microseconds, told apart by magnitude as APM agents do);
    ``None`` when absent or malformed. Never negative."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip().removeprefix("t=")
    try:
        stamp = float(text)
    except ValueError:
        return None
    if not math.isfinite(stamp) or stamp <= 0:
        return None
    for scale in (1.0, 1e3, 1e6):
        if stamp / scale < 1e10:  # epoch seconds have 10 digits until the year 2286
            return max(0.0, wall_now - stamp / scale)
    return None


# -- rejections as answers ---------------------------------------------------------------------


def rejection_status(error: RejectedError) -> int:
    """The HTTP status answering ``error`` (see :data:`STATUS_OF_KIND`)."""
    return STATUS_OF_KIND.get(error.kind, 503)


def problem(
    status: int,
    kind: str,
    detail: str,
    *,
    retry_after: float | None = None,
    type_base: str | None = None,
) -> bytes:
    """An RFC 9457 problem-details body (``application/problem+json``, UTF-8). ``type`` is
    ``about:blank`` (the status says it all), or ``type_base`` + the kind (``rate-limited``)
    when the service documents its problems at such URLs; ``kind`` is always there."""
    body: dict[str, object] = {
        "type": "about:blank" if type_base is None else type_base + kind.replace("_", "-"),
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "kind": kind,
    }
    if retry_after is not None and math.isfinite(retry_after):
        body["retry_after"] = round(retry_after, 3)
    return json.dumps(body, separators=(",", ":")).encode()


def whole_seconds(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds rounded up (never early), at least 0."""
    return str(max(0, math.ceil(seconds - 1e-9)))


HeaderGetter = Callable[[str], str | None]
"""Reads one header by its lower-case name (``None`` when absent)."""
