"""FallbackSource: when the dependency fails, ask a backup data source instead.

The seeds' recommendation feed: the ranking service is compute-heavy and sometimes slow or
down, so a backup service keeps a list of popular items computed offline every night; when the
ranking call fails, the feed asks the backup. The backup is a dependency too, so it runs under
its own ``pipeline`` (a timeout and a breaker of its own, say), never the primary's.

``FallbackSource(backup, pipeline=Pipeline(CircuitBreaker("backup"), Timeout(0.2)))`` is a
policy: it runs the call, and when the call fails in a way it handles (``on=`` / ``kinds=``, as
:class:`~floodwall.Fallback`; default any ``Exception``) it calls ``backup`` with the **same
arguments**, through ``pipeline``. A backup answer is marked degraded (``degraded`` counter, a
``fallback_source`` event, the open :func:`floodwall.call_context`). If the backup fails too,
the **primary's** exception propagates (the caller's dependency failed; the backup was the
attempt to degrade), with a note naming the backup's failure; ``backup_failures`` counts them.

For static data (the live-stream gift list served by the gateway when the gift service is
down) a plain :class:`~floodwall.Fallback` with ``value=`` is enough; for the last value the
dependency gave, :class:`~floodwall.Cache` with stale-while-error.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any, ParamSpec, TypeVar

from floodwall._core import validate
from floodwall._core.admission import Flow
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.outcome import Outcomes
from floodwall._core.policy import Policy
from floodwall._core.steps import CALL, FlowSteps, Invoke, NeedsAsyncError
from floodwall.degrade._common import mark_degraded, reason_of

__all__ = ["FallbackSource"]

P = ParamSpec("P")
R = TypeVar("R")


class FallbackSource(Flow):
    """Answer from ``backup(*args, **kwargs)`` when the call fails (see
    [Degradation][guide-degradation]).

    ``backup`` may be an ``async def`` for :meth:`call_async`; :meth:`call` refuses one with a
    :class:`~floodwall.ConfigError`.
    """

    kind = "fallback_source"

    def __init__(
        self,
        backup: Callable[..., Any],
        *,
        pipeline: Policy | None = None,
        on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None,
        kinds: Collection[str] | None = None,
        name: str = "fallback_source",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if not callable(backup):
            raise ConfigError(f"backup must be callable, got {backup!r}")
        if pipeline is not None and not isinstance(pipeline, Policy):
            raise ConfigError(f"pipeline must be a floodwall Policy, got {pipeline!r}")
        self.backup = backup
        self.pipeline = pipeline
        self.handled = Outcomes.handled(on, kinds)
        """The errors answered from the backup or the cache (``on=`` and ``kinds=``)."""
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.degraded = 0
        """Answers the backup gave instead of the dependency."""
        self.backup_failures = 0
        """Times the backup failed too (the primary's failure then propagated)."""

    def _answered(self, primary: BaseException) -> None:
        self.degraded += 1
        reason = reason_of(primary)
        mark_degraded(self.name, reason)
        self._emit("fallback_source", reason, {"primary": repr(primary)})

    def _failed(self, primary: BaseException, backup: BaseException) -> BaseException:
        self.backup_failures += 1
        primary.add_note(f"fallback source {self.name!r} failed too: {backup!r}")
        self._emit("fallback_source_failed", reason_of(backup), {"primary": repr(primary)})
        return primary

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """Call; on a handled failure, call the backup with the same arguments (through its
        pipeline); if that fails too, the primary's failure propagates with a note."""
        try:
            return (yield CALL)
        except BaseException as primary:
            if not self.handled.error(primary):
                raise
            what = f"fallback source {self.name!r} has an async backup"
            failed: Exception | None = None
            try:
                answer = yield Invoke(self.backup, args, kwargs, self.pipeline, what)
            except NeedsAsyncError as refused:
                raise refused from primary
            except Exception as backup:  # noqa: BLE001 - the primary's error propagates
                failed = backup
            if failed is not None:
                raise self._failed(primary, failed)  # noqa: B904 - the primary, unchanged
            self._answered(primary)
            return answer

    def _emit(self, kind: str, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            now = self.clock.monotonic()
            self.listeners.emit(Event(kind, self.kind, self.name, now, reason, figures=figures))

    def describe(self) -> str:
        inner = f", pipeline={self.pipeline.describe()}" if self.pipeline is not None else ""
        return f"FallbackSource({self.name!r}{inner})"
