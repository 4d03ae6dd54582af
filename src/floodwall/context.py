"""Ambient per-call context: the deadline that shrinks along a call chain, and what happened.

``deadline(seconds)`` sets an absolute deadline for everything inside it; nested deadlines and
timeouts can only make it earlier, never later, so the time left shrinks at every hop (later
issues carry it over HTTP and gRPC). ``remaining()`` is what any code, including a client
library's socket timeout, should wait at most.

``call_context()`` opens a record of what the policies did for one logical call (for now:
whether a fallback answered instead of the dependency), read by integrations for response
headers and metrics.

Both live in :mod:`contextvars`, so they follow asyncio tasks and are isolated per thread.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from types import TracebackType

from floodwall._core.clock import SYSTEM_CLOCK, Clock

__all__ = ["CallContext", "Deadline", "call_context", "current_call", "deadline", "remaining"]


@dataclass(frozen=True, slots=True)
class Deadline:
    """An absolute point on ``clock``'s timeline."""

    at: float
    clock: Clock

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


class deadline:  # noqa: N801 - used like a function: ``with floodwall.deadline(2.0):``
    """Context manager (sync and async) that bounds everything inside to ``seconds`` from now.

    An enclosing deadline that ends sooner wins: the effective deadline is the earlier of the
    two. ``seconds`` must be finite and >= 0.
    """

    __slots__ = ("_clock", "_seconds", "_token", "deadline")

    def __init__(self, seconds: float, *, clock: Clock = SYSTEM_CLOCK) -> None:
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        self._seconds = float(seconds)
        self._clock = clock
        self._token: contextvars.Token[Deadline | None] | None = None
        self.deadline: Deadline | None = None

    def __enter__(self) -> Deadline:
        seconds = self._seconds
        outer = _DEADLINE.get()
        if outer is not None:
            seconds = min(seconds, outer.remaining())
        self.deadline = Deadline(self._clock.monotonic() + seconds, self._clock)
        self._token = _DEADLINE.set(self.deadline)
        return self.deadline

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _DEADLINE.reset(self._token)
            self._token = None

    async def __aenter__(self) -> Deadline:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


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


_CALL: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "floodwall_call", default=None
)


def current_call() -> CallContext | None:
    """The innermost open :class:`CallContext`, or ``None`` outside ``call_context()``."""
    return _CALL.get()


class call_context:  # noqa: N801 - used like a function: ``with floodwall.call_context() as c:``
    """Context manager (sync and async) that opens a fresh :class:`CallContext`."""

    __slots__ = ("_token", "context")

    def __init__(self) -> None:
        self.context = CallContext()
        self._token: contextvars.Token[CallContext | None] | None = None

    def __enter__(self) -> CallContext:
        self._token = _CALL.set(self.context)
        return self.context

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _CALL.reset(self._token)
            self._token = None

    async def __aenter__(self) -> CallContext:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
