"""Ambient per-call context: the deadline that shrinks along a call chain, and what happened.

``deadline(seconds)`` sets an absolute deadline for everything inside it; nested deadlines and
timeouts can only make it earlier, never later, so the time left shrinks at every hop (later
issues carry it over HTTP and gRPC). ``remaining()`` is what any code, including a client
library's socket timeout, should wait at most.

``call_context()`` opens a record of what the policies did for one logical call (for now:
whether a fallback answered instead of the dependency), read by integrations for response
headers and metrics.

``retry_marker(attempt, origin)`` says "this work is a retry": :class:`~floodwall.Retry` sets it
around every attempt after the first, and a nested ``Retry`` that sees it does not retry again
(one retrying layer per request, not one per tier). Integrations will carry it over HTTP headers
and gRPC metadata, so a downstream service sees it too.

``idempotency_key(key)`` names the logical write a call belongs to; a ``Retry`` declared for
non-idempotent work (``idempotent=False``) retries only when a key is set, since the key is what
lets the server recognise a duplicate.

All of them live in :mod:`contextvars`, so they follow asyncio tasks and are isolated per thread.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

from floodwall._core import validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock

__all__ = [
    "CallContext",
    "Deadline",
    "RetryMarker",
    "call_context",
    "current_call",
    "current_deadline",
    "current_idempotency_key",
    "current_retry",
    "deadline",
    "idempotency_key",
    "remaining",
    "retry_marker",
]

_INF = math.inf


V = TypeVar("V")


class _Scope(Generic[V]):
    """Sets a context variable on entry and restores it on exit, in ``with`` and ``async with``.

    Every ambient value here (deadline, call record, retry marker, idempotency key) is one of
    these: subclasses say which variable (``_var``) and which value (:meth:`_value`).
    """

    __slots__ = ("_token",)
    _var: ClassVar[contextvars.ContextVar[Any]]
    _token: contextvars.Token[Any] | None

    def _value(self) -> V:
        raise NotImplementedError

    def __enter__(self) -> V:
        value = self._value()
        self._token = self._var.set(value)
        return value

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token = getattr(self, "_token", None)
        if token is not None:
            self._var.reset(token)
            self._token = None

    async def __aenter__(self) -> V:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


class Deadline:
    """An absolute point on ``clock``'s timeline (treat as immutable).

    A plain slotted class, not a frozen dataclass: timeouts create one per call, and a frozen
    dataclass's ``__init__`` costs several times more.
    """

    __slots__ = ("at", "clock")

    def __init__(self, at: float, clock: Clock) -> None:
        self.at = at
        self.clock = clock

    def __repr__(self) -> str:
        return f"Deadline(at={self.at!r}, clock={self.clock!r})"

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - self.clock.monotonic()


_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "floodwall_deadline", default=None
)


def remaining() -> float | None:
    """Seconds left before the ambient deadline, or ``None`` when no deadline is set.

    The value is negative once the deadline has passed.
    """
    current = _DEADLINE.get()
    return None if current is None else current.remaining()


def current_deadline() -> Deadline | None:
    """The ambient :class:`Deadline`, or ``None``."""
    return _DEADLINE.get()


class deadline(_Scope[Deadline]):  # noqa: N801 - used like a function, in `with`
    """Context manager (sync and async) that bounds everything inside to ``seconds`` from now.

    An enclosing deadline that ends sooner wins: the effective deadline is the earlier of the
    two. ``seconds`` must be finite and >= 0.
    """

    __slots__ = ("_clock", "_seconds", "deadline")
    _var = _DEADLINE

    def __init__(self, seconds: float, *, clock: Clock = SYSTEM_CLOCK) -> None:
        if seconds.__class__ is not float or not 0 <= seconds < _INF:  # the common case: 1 check
            seconds = validate.seconds("seconds", seconds, error=ValueError)
        self._seconds = seconds
        self._clock = clock
        self.deadline: Deadline | None = None

    def _value(self) -> Deadline:
        seconds = self._seconds
        outer = _DEADLINE.get()
        if outer is not None:
            seconds = min(seconds, outer.remaining())
        self.deadline = Deadline(self._clock.monotonic() + seconds, self._clock)
        return self.deadline


def _set_deadline(value: Deadline) -> contextvars.Token[Deadline | None]:
    """Install ``value`` as the ambient deadline (policies use this; users use ``deadline``)."""
    return _DEADLINE.set(value)


def _reset_deadline(token: contextvars.Token[Deadline | None]) -> None:
    _DEADLINE.reset(token)


@dataclass(slots=True)
class CallContext:
    """What the policies did during one logical call.

    ``degraded_by`` names the policy that answered instead of the dependency (``None`` if the
    dependency answered), ``degraded_reason`` says why (the rejection kind or exception type).
    """

    degraded_by: str | None = None
    degraded_reason: str | None = None

    @property
    def degraded(self) -> bool:
        return self.degraded_by is not None


_REQUEST: contextvars.ContextVar[Any] = contextvars.ContextVar("floodwall_hop", default=None)
"""The inbound request being served (an integration's ``Hop``; typed there, in
:mod:`floodwall.integrations._wire`). An admitted request's record carries its own
:class:`CallContext` as ``call``, so a server shell sets one variable per request, not two."""

_CALL: contextvars.ContextVar[tuple[CallContext, object] | None] = contextvars.ContextVar(
    "floodwall_call", default=None
)
"""The innermost :func:`call_context` opened, with the request record current when it was opened.
When the request record changed since (a request was admitted inside it), the request's own call
record is the innermost one: the same answer as if the admission had set this variable too."""


def current_call() -> CallContext | None:
    """The innermost open :class:`CallContext`, or ``None`` outside ``call_context()``.

    That is the one of the inbound request being served, unless a ``call_context()`` was opened
    inside it (O(1), two context reads).
    """
    opened = _CALL.get()
    request = _REQUEST.get()
    if request is not None and (opened is None or opened[1] is not request):
        call: CallContext | None = getattr(request, "call", None)
        if call is not None:
            return call
    return None if opened is None else opened[0]


class call_context(_Scope[CallContext]):  # noqa: N801 - used like a function, in `with`
    """Context manager (sync and async) that opens a fresh :class:`CallContext`.

    Its variable holds the context with the request record of the moment (see ``_CALL``), while
    ``with`` hands out the context alone: only :meth:`__enter__` differs from other scopes.
    """

    __slots__ = ("context",)
    _var = _CALL

    def __init__(self) -> None:
        self.context = CallContext()

    def __enter__(self) -> CallContext:
        self._token = _CALL.set((self.context, _REQUEST.get()))
        return self.context


# -- retry marker ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryMarker:
    """The work running now is retry attempt ``attempt`` (2 for the first retry) of ``origin``.

    Its presence means "a layer above is already retrying this request: do not retry below
    me". ``origin`` names the policy (or, once carried over the network, the service) that
    retries.
    """

    attempt: int
    origin: str


_RETRY: contextvars.ContextVar[RetryMarker | None] = contextvars.ContextVar(
    "floodwall_retry", default=None
)

_BUDGETS: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "floodwall_charged_budgets", default=()
)
"""Retry budgets already charged for the logical request running now (shared budgets only), so
nested policies sharing a budget count one request once, not once per layer."""


def current_retry() -> RetryMarker | None:
    """The innermost :class:`RetryMarker`, or ``None`` when no layer above is retrying."""
    return _RETRY.get()


class retry_marker(_Scope[RetryMarker]):  # noqa: N801 - used like a function, in `with`
    """Context manager (sync and async) marking everything inside as retry ``attempt``.

    :class:`~floodwall.Retry` does this itself; integrations use it to restore a marker that
    arrived in a request header. ``attempt`` must be an integer >= 2 (attempt 1 is no retry).
    """

    __slots__ = ("marker",)
    _var = _RETRY

    def __init__(self, attempt: int, origin: str) -> None:
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 2:
            raise ValueError(f"attempt must be an integer >= 2 (a retry), got {attempt!r}")
        self.marker = RetryMarker(attempt, validate.text("origin", origin, error=ValueError))

    def _value(self) -> RetryMarker:
        return self.marker


# -- idempotency key ------------------------------------------------------------------------


_IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "floodwall_idempotency_key", default=None
)


def current_idempotency_key() -> str | None:
    """The ambient idempotency key, or ``None`` outside :class:`idempotency_key`."""
    return _IDEMPOTENCY_KEY.get()


class idempotency_key(_Scope[str]):  # noqa: N801 - used like a function, in `with`
    """Context manager (sync and async) naming the logical write everything inside belongs to.

    Every attempt of a retried write carries the same key, so the server (or a key store) can
    tell a retry from a new write and answer it without doing the work twice. ``key`` must be
    a non-empty string; the innermost key wins.
    """

    __slots__ = ("key",)
    _var = _IDEMPOTENCY_KEY

    def __init__(self, key: str) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty string, got {key!r}")
        self.key = key

    def _value(self) -> str:
        return self.key
