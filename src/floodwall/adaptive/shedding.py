"""LoadShedder: the server-side guard that refuses work before it starts.

One guard in front of a handler (the ASGI/WSGI middleware and the gateway build on it):

1. it measures the request's **queueing time**, ``now − arrived_at`` on the guard's clock (or a
   ``queue_time`` the caller computed, e.g. from an ``X-Request-Start`` header), and sheds a
   request that already waited longer than ``max_queue_time``: its client has probably given
   up, and serving it only delays the next one;
2. it consults the chosen **limiter**: an :class:`~floodwall.adaptive.AdaptiveLimiter`
   (concurrency limit; partition by request class), a :class:`~floodwall.adaptive.BBRLimiter`
   (CPU + in-flight), or a :class:`~floodwall.adaptive.QueueingTimeAdmission` (DAGOR: priority
   admission, fed the queueing time);
3. it counts **in-flight** work and hands back a :class:`Ticket` to close when the work ends.

A refused request raises :class:`~floodwall.OverloadedError` (``kind == "overloaded"``, mapped to
HTTP 503 with ``Retry-After: retry_after``). Rejecting costs a clock read, a lock and the
exception: far less than the work it saves, which is the point under overload.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, OverloadedError, RejectedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.policy import Policy
from floodwall._core.tally import Tally
from floodwall.adaptive.bbr import BBRLimiter
from floodwall.adaptive.dagor import QueueingTimeAdmission
from floodwall.adaptive.limiter import AdaptiveLimiter

__all__ = ["LoadShedder", "Permit", "ShedderStats", "Ticket"]

R = TypeVar("R")


class Permit(Protocol):
    """What a limiter hands out: close it once as success, dropped or ignored."""

    def success(self) -> bool: ...

    def dropped(self) -> bool: ...

    def ignore(self) -> bool: ...


Limiter = AdaptiveLimiter | BBRLimiter | QueueingTimeAdmission

_NONE, _ADAPTIVE, _BBR, _DAGOR = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ShedderStats:
    """Counters since the guard was built, and the current in-flight count."""

    inflight: int
    admitted: int
    shed: int
    shed_stale: int
    average_queue_time: float


class Ticket:
    """An admitted request. Close it once (``success``/``dropped``/``ignore``) or use ``with``:
    a clean exit is a success, a timeout or rejection downstream is dropped, else ignored."""

    __slots__ = ("_open", "_permit", "_shedder", "queue_time")

    def __init__(self, shedder: LoadShedder, permit: Permit | None, queue_time: float) -> None:
        self._shedder = shedder
        self._permit = permit
        self._open = True
        self.queue_time = queue_time
        """Seconds the request waited before the guard saw it."""

    def _close(self) -> bool:
        if not self._open:
            return False
        self._open = False
        self._shedder._finished.add()
        return True

    def success(self) -> bool:
        if not self._close():
            return False
        return self._permit is None or self._permit.success()

    def dropped(self) -> bool:
        if not self._close():
            return False
        return self._permit is None or self._permit.dropped()

    def ignore(self) -> bool:
        if not self._close():
            return False
        return self._permit is None or self._permit.ignore()

    def close(self, error: BaseException | None) -> bool:
        """Close after a call that raised ``error`` (``None``: it returned): a success, dropped
        for a timeout or a rejection downstream, else ignored."""
        if error is None:
            return self.success()
        if isinstance(error, TimeoutError | RejectedError):
            return self.dropped()
        return self.ignore()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(exc)


class LoadShedder(Gate):
    """Server-side load-shedding guard (see [Overload protection][guide-overload]).

    ``limiter=None`` guards on queueing time alone (then ``max_queue_time`` must be set).

    As a gate: ``admit`` (also the public method, called with keywords) hands out a
    :class:`Ticket` or raises :class:`~floodwall.OverloadedError`; ``record`` closes the ticket
    from the outcome (:meth:`Ticket.close`).
    """

    kind = "load_shedder"

    def __init__(
        self,
        limiter: Limiter | None = None,
        *,
        name: str = "load_shedder",
        max_queue_time: float | None = None,
        retry_after: float | None = defaults.SHED_RETRY_AFTER,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        if limiter is not None and not isinstance(
            limiter, AdaptiveLimiter | BBRLimiter | QueueingTimeAdmission
        ):
            raise ConfigError(
                "limiter must be an AdaptiveLimiter, BBRLimiter or QueueingTimeAdmission, "
                f"got {limiter!r}"
            )
        if max_queue_time is not None:
            validate.seconds("max_queue_time", max_queue_time, positive=True)
        if limiter is None and max_queue_time is None:
            raise ConfigError("a LoadShedder needs a limiter, a max_queue_time or both, got none")
        if retry_after is not None:
            validate.seconds("retry_after", retry_after)
        self.limiter = limiter
        # The limiter's kind, decided once: admit() branches on an int, not on isinstance.
        self._adaptive = limiter if isinstance(limiter, AdaptiveLimiter) else None
        self._bbr = limiter if isinstance(limiter, BBRLimiter) else None
        self._dagor = limiter if isinstance(limiter, QueueingTimeAdmission) else None
        self._kind = (
            _NONE
            if limiter is None
            else _ADAPTIVE
            if self._adaptive is not None
            else _BBR
            if self._bbr is not None
            else _DAGOR
        )
        self.name = validate.text("name", name)
        self.max_queue_time = max_queue_time
        self.retry_after = retry_after
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._lock = threading.Lock()
        # Admissions and completions are counted lock-free (a tally's add() is one C call,
        # atomic under the GIL); in flight is their difference. The lock guards the rest.
        self._admitted = Tally()
        self._finished = Tally()
        self._shed = 0
        self._stale = 0
        self._queued = 0.0

    # -- the decision -------------------------------------------------------------------------

    def _permit(
        self, waited: float, known: bool, partition: str | None, business: int, user: int
    ) -> tuple[bool, Permit | None]:
        """The limiter's verdict: ``(admitted, permit)``; no limiter admits without a permit."""
        kind = self._kind
        if kind == _NONE:
            return True, None
        if kind == _ADAPTIVE:
            permit: Permit | None = self._adaptive.acquire(partition)  # type: ignore[union-attr]
        elif kind == _BBR:
            permit = self._bbr.acquire()  # type: ignore[union-attr]
        else:
            permit = self._dagor.acquire(  # type: ignore[union-attr]
                waited if known else None, business, user
            )
        return permit is not None, permit

    def admit(
        self,
        now: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        arrived_at: float | None = None,
        queue_time: float | None = None,
        partition: str | None = None,
        business: int = 0,
        user: int = 0,
    ) -> Ticket:
        """Admit one request or raise :class:`~floodwall.OverloadedError`.

        ``arrived_at`` is the arrival on this guard's clock (or pass ``queue_time`` directly);
        ``partition`` selects an :class:`AdaptiveLimiter` partition; ``business``/``user`` are
        DAGOR priorities (0 = most important). Cost: no clock read unless ``arrived_at`` is
        given; one lock round trip here and one in the limiter. ``now``, ``args`` and ``kwargs``
        are what the drivers pass when the guard runs as a gate around a call (unused here).
        """
        if queue_time is not None:
            waited = max(0.0, queue_time)
            known = True
        elif arrived_at is not None:
            waited = max(0.0, self._now() - arrived_at)
            known = True
        else:
            waited = 0.0
            known = False
        limit = self.max_queue_time
        if limit is not None and waited > limit:
            raise self._refuse(
                f"queued {waited * 1000:.0f} ms > {limit * 1000:.0f} ms",
                stale=True,
            )
        admitted, permit = self._permit(waited, known, partition, business, user)
        if not admitted:
            raise self._refuse(self._why())
        self._admitted.add()
        if waited:
            with self._lock:
                self._queued += waited
        return Ticket(self, permit, waited)

    def _why(self) -> str:
        limiter = self.limiter
        if isinstance(limiter, AdaptiveLimiter):
            return f"concurrency limit {limiter.limit} reached ({limiter.inflight} in flight)"
        if isinstance(limiter, BBRLimiter):
            return "CPU overloaded and in-flight above what the service sustains (BBR)"
        if isinstance(limiter, QueueingTimeAdmission):
            level = limiter.level
            return f"priority below admission level ({level.business}, {level.user}) (DAGOR)"
        return "overloaded"  # pragma: no cover - max_queue_time refusals have their own reason

    def _refuse(self, reason: str, *, stale: bool = False) -> OverloadedError:
        with self._lock:
            self._shed += 1
            if stale:
                self._stale += 1
        if self.listeners:
            self.listeners.emit(
                Event(
                    "shed",
                    self.kind,
                    self.name,
                    self._now(),
                    reason,
                    figures={"inflight": self.inflight, "stale": stale},
                )
            )
        return OverloadedError(self.name, reason, self.retry_after)

    # -- figures ------------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        """Tickets handed out and not yet closed."""
        finished = self._finished.value  # read first: the difference is never negative
        return self._admitted.value - finished

    def stats(self) -> ShedderStats:
        with self._lock:
            finished = self._finished.value
            admitted = self._admitted.value
            average = self._queued / admitted if admitted else 0.0
            inflight = admitted - finished
            return ShedderStats(inflight, admitted, self._shed, self._stale, average)

    # -- the admission hooks (``admit`` above) ----------------------------------------------

    def record(
        self,
        permit: Ticket,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Close the ticket from the outcome (see :meth:`Ticket.close`)."""
        permit.close(error)

    def guard(self, fn: Callable[[], R], *, arrived_at: float | None = None) -> R:
        """Run ``fn()`` for a request that arrived at ``arrived_at`` (sync convenience)."""
        with self.admit(arrived_at=arrived_at):
            return fn()

    def describe(self) -> str:
        inner = self.limiter.describe() if isinstance(self.limiter, Policy) else repr(self.limiter)
        return f"LoadShedder({inner}, max_queue_time={self.max_queue_time})"
