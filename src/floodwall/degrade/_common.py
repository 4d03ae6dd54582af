"""What the degradation tools share: marking degraded answers, and the rejection a full backlog
raises. Which failures they handle is an :class:`~floodwall.Outcomes` (``on=``, ``kinds=``)."""

from __future__ import annotations

from floodwall._core.errors import BacklogFullError, RejectedError
from floodwall._core.meter import note_degraded
from floodwall.context import current_call

__all__ = ["BacklogFullError", "mark_degraded", "reason_of"]


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
