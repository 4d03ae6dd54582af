"""What the degradation tools share: which failures they handle, marking degraded answers, and
the rejection a full backlog raises."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from floodwall._core.errors import BacklogFullError, ConfigError, RejectedError
from floodwall._core.meter import note_degraded
from floodwall.context import current_call

__all__ = ["BacklogFullError", "Matcher", "mark_degraded", "reason_of"]


@dataclass(frozen=True, slots=True)
class Matcher:
    """Which failures a tool answers for, as :class:`~floodwall.Fallback` chooses them: by
    exception type (``on``) and/or rejection kind (``kinds``); either matches; neither given:
    any ``Exception`` (never ``CancelledError`` or ``KeyboardInterrupt``)."""

    on: tuple[type[BaseException], ...] | None = None
    kinds: frozenset[str] | None = None

    @classmethod
    def of(
        cls,
        on: type[BaseException] | tuple[type[BaseException], ...] | None,
        kinds: Collection[str] | None,
    ) -> Matcher:
        if kinds is not None and isinstance(kinds, str):
            raise ConfigError(f"kinds must be a collection of rejection kinds, got {kinds!r}")
        types = None if on is None else (on if isinstance(on, tuple) else (on,))
        return cls(types, None if kinds is None else frozenset(kinds))

    def __call__(self, exc: BaseException) -> bool:
        if self.on is None and self.kinds is None:
            return isinstance(exc, Exception)
        if self.on is not None and isinstance(exc, self.on):
            return True
        return self.kinds is not None and isinstance(exc, RejectedError) and exc.kind in self.kinds


def reason_of(exc: BaseException) -> str:
    """The rejection kind, or the exception's type name."""
    return exc.kind if isinstance(exc, RejectedError) else type(exc).__name__


def mark_degraded(name: str, reason: str) -> None:
    """Record in the open :func:`floodwall.call_context` that ``name`` answered instead of the
    dependency, and why (and tell the resource's meter)."""
    note_degraded(name, reason)
    context = current_call()
    if context is not None:
        context.degraded_by = name
        context.degraded_reason = reason
