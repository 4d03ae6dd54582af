"""Outcomes are values inside the core.

Shells turn a call's result or exception into an :class:`Outcome`; decision cores classify it
into a :class:`Kind` and never raise. Only the outermost shell raises.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Kind", "Outcome"]

T = TypeVar("T")


class Kind(enum.IntEnum):
    """How a call ended, as windows and metrics count it. Numbers are stable."""

    SUCCESS = 0
    FAILURE = 1
    """An exception or a result the policy counts as failed (e.g. an HTTP 503 value)."""
    TIMEOUT = 2
    """The call ran out of time."""
    REJECTED = 3
    """A downstream policy (e.g. a full bulkhead) refused the call."""
    IGNORED = 4
    """Counted nowhere: an exception the policy was told to ignore, such as a business error."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """A call's result or exception, plus whether a fallback produced it."""

    value: T | None = None
    exception: BaseException | None = None
    degraded: bool = False

    @property
    def ok(self) -> bool:
        """True when the call returned a value (possibly a degraded one)."""
        return self.exception is None

    def unwrap(self) -> T:
        """Return the value or raise the exception."""
        if self.exception is not None:
            raise self.exception
        return self.value  # type: ignore[return-value]
