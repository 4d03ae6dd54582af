"""The exception hierarchy: one root, typed rejections with structured fields.

Every rejection says which policy refused the call, why, and (where known) when to come back.
Rejections are raised on the hot path of an outage, so they are cheap: plain attributes, the
message built lazily in ``__str__``.
"""

from __future__ import annotations

__all__ = [
    "BacklogFullError",
    "BulkheadFullError",
    "CircuitOpenError",
    "ConfigError",
    "DegradedError",
    "FailedResult",
    "FloodwallError",
    "LimitStoreUnavailableError",
    "OverloadedError",
    "RateLimitedError",
    "RejectedError",
    "TimeoutExceeded",
]


class FloodwallError(Exception):
    """Root of every exception floodwall raises."""


class ConfigError(FloodwallError, ValueError):
    """An option has a bad value; the message names the option and the value."""


class RejectedError(FloodwallError):
    """A policy refused to run the call: ``RejectedError(name, reason, retry_after)``.

    ``kind`` is a stable short name (``"circuit_open"``, ``"timeout"``, …) used by fallbacks,
    metrics and HTTP integrations; ``retry_after`` is the number of seconds after which trying
    again may succeed, or ``None`` when unknown.

    Rejections are raised on the hot path of an outage, so they have no Python ``__init__``:
    the fields live in ``args`` (stored by C code) and are read through properties, and the
    message is only built when someone prints it.
    """

    kind: str = "rejected"
    args: tuple[str, str, float | None]

    @property
    def name(self) -> str:
        """The name of the policy that refused the call."""
        return self.args[0]

    @property
    def reason(self) -> str:
        """Why the call was refused, in words."""
        return self.args[1]

    @property
    def retry_after(self) -> float | None:
        """Seconds after which trying again may succeed; ``None`` when unknown."""
        return self.args[2] if len(self.args) > 2 else None

    def __str__(self) -> str:
        text = f"{self.name!r} rejected the call: {self.reason}"
        retry_after = self.retry_after
        if retry_after is not None:
            text += f" (retry after {retry_after:.3f}s)"
        return text


class CircuitOpenError(RejectedError):
    """The circuit breaker ``name`` is in ``state`` and refused the call:
    ``CircuitOpenError(name, state, retry_after)``."""

    kind = "circuit_open"
    args: tuple[str, object, float | None]  # type: ignore[assignment]

    @property
    def state(self) -> object:
        """The breaker's state when it refused (a ``CircuitState``)."""
        return self.args[1]

    @property
    def reason(self) -> str:
        state = self.args[1]
        return f"circuit is {getattr(state, 'name', state)}"


class TimeoutExceeded(RejectedError, TimeoutError):  # noqa: N818 - the name is the public contract
    """The call ran past ``timeout`` seconds (or past the ambient deadline) and was abandoned:
    ``TimeoutExceeded(name, timeout, reason=None)``.

    Being a :class:`TimeoutError` too, it is an ``OSError``, whose constructor reinterprets
    ``args``; the fields are therefore kept as attributes.
    """

    kind = "timeout"

    def __init__(self, name: str, timeout: float, reason: str | None = None) -> None:
        super().__init__(name, timeout, reason)
        self._fields = (name, timeout, reason)

    @property
    def name(self) -> str:
        return self._fields[0]

    @property
    def timeout(self) -> float:
        """The budget, in seconds, that ran out."""
        return self._fields[1]

    @property
    def reason(self) -> str:
        return self._fields[2] or f"no answer within {self._fields[1]:.3f}s"

    @property
    def retry_after(self) -> float | None:
        return None

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self._fields)


class FailedResult(FloodwallError):  # noqa: N818 - a value, handed to factories, not raised
    """A call returned a value that a policy counts as a failure (an HTTP 503 response).

    Handed to fallback factories in place of an exception; ``result`` is the value.
    """

    def __init__(self, name: str, result: object) -> None:
        super().__init__(name, result)
        self.name = name
        self.result = result

    def __str__(self) -> str:
        return f"{self.name!r} counted the result {self.result!r} as a failure"


class RateLimitedError(RejectedError):
    """A rate limiter refused the call: ``RateLimitedError(name, reason, retry_after)``."""

    kind = "rate_limited"


class LimitStoreUnavailableError(RateLimitedError):
    """A shared limit could not be checked: its store is down and ``on_store_error`` is
    ``"fail_closed"``. ``LimitStoreUnavailableError(name, reason, retry_after)``.

    It is floodwall's outage, not the caller's rate: HTTP integrations answer it 503 with
    ``Retry-After`` (when the store is probed again), not 429, and metrics count it under
    ``kind="store_unavailable"``. A :class:`RateLimitedError` still, so code that catches the
    limiter's refusals keeps catching it.
    """

    kind = "store_unavailable"


class BulkheadFullError(RejectedError):
    """A bulkhead had no free slot and no room to wait: ``BulkheadFullError(name, reason,
    retry_after, max_concurrent, max_queue, in_flight, queued)`` (the figures are optional).

    The figures are the bulkhead's at the moment it refused: its limits (``max_concurrent``,
    ``max_queue``) and how many calls held a slot (``in_flight``) or waited (``queued``).
    Like every rejection they live in ``args`` (no Python ``__init__``: refusing stays cheap).
    """

    kind = "bulkhead_full"
    args: tuple[object, ...]  # type: ignore[assignment]

    def _figure(self, index: int) -> int | None:
        args = self.args
        value = args[index] if len(args) > index else None
        return value if isinstance(value, int) else None

    @property
    def max_concurrent(self) -> int | None:
        """Calls the bulkhead lets run at once (threads, for a thread pool)."""
        return self._figure(3)

    @property
    def max_queue(self) -> int | None:
        """Callers the bulkhead lets wait."""
        return self._figure(4)

    @property
    def in_flight(self) -> int | None:
        """Calls holding a slot when the call was refused."""
        return self._figure(5)

    @property
    def queued(self) -> int | None:
        """Callers waiting when the call was refused."""
        return self._figure(6)

    def __str__(self) -> str:
        text = super().__str__()
        if len(self.args) > 6:
            text += (
                f" ({self.in_flight}/{self.max_concurrent} in flight, "
                f"{self.queued}/{self.max_queue} queued)"
            )
        return text


class OverloadedError(RejectedError):
    """Load shedding refused the call before the work started (HTTP 503 with Retry-After):
    ``OverloadedError(name, reason, retry_after)``."""

    kind = "overloaded"


class DegradedError(RejectedError):
    """The dependency was switched off (its level is shed) and no fallback answered:
    ``DegradedError(name, reason, retry_after)``."""

    kind = "degraded"


class BacklogFullError(RejectedError):
    """A write-behind queue or a coalescer is full and refused the write:
    ``BacklogFullError(name, reason, retry_after)`` (HTTP 503)."""

    kind = "backlog_full"
