"""Timeouts that stop waiting, and shrink along a call chain.

``Timeout(seconds)`` bounds a call to ``seconds`` or to the ambient :func:`floodwall.deadline`,
whichever ends first, and installs that bound as the deadline of everything inside, so nested
timeouts and ``floodwall.remaining()`` see the time left shrink.

**Async** (``call_async``): the awaited work is cancelled at the deadline and the caller gets
:class:`TimeoutExceeded` (also a :class:`TimeoutError`); a cancellation from outside still
propagates as ``CancelledError``. Cost: there is no timer handle per call. Calls under one
``Timeout`` expire in the order they started, so each call appends an entry to a FIFO and a single
watchdog task per event loop sleeps until the oldest live entry is due (entries that end early are
dropped from the head as they finish). Calls whose inherited deadline is earlier than their own
go to a small heap next to the FIFO.

**Sync** (``call``) cannot cancel a running thread; ``mode`` says what it does instead:

* ``"signal"`` (the default in the main thread on POSIX): a ``SIGALRM`` interval timer
  interrupts the call: pure-Python code and blocking system calls (sleep, socket reads) are
  interrupted; C code that never returns to the interpreter is not.
* ``"thread"``: the call runs in a fresh worker thread and the caller stops waiting at the
  deadline. The worker cannot be killed: it is counted in :attr:`Timeout.abandoned` until it
  ends, a ``"thread_abandoned"`` event is emitted, and once ``thread_limit`` abandoned workers are
  still running, new calls are refused at once instead of leaking more threads.
* ``"cooperative"`` (the default elsewhere): the call runs to its end in the caller's thread;
  if it ran past the deadline the result is discarded and :class:`TimeoutExceeded` raised, so a
  late answer never counts as a success. Code inside should bound its own I/O with
  ``floodwall.remaining()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

from floodwall._core import defaults, validate
from floodwall._core.admission import Scoped
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import TimeoutExceeded
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all
from floodwall._core.timebox import Timebox, Watchdogs
from floodwall.context import _DEADLINE

__all__ = ["Timeout", "TimeoutOptions"]

SyncMode = Literal["auto", "signal", "thread", "cooperative"]

_INF = float("inf")
_MODES = ("auto", "signal", "thread", "cooperative")


@dataclass(frozen=True, slots=True)
class TimeoutOptions:
    """A :class:`Timeout`'s options, validated once: ``seconds`` (finite, > 0), the sync
    ``mode`` and the ``thread_limit`` of ``mode="thread"``."""

    seconds: float
    mode: SyncMode = "auto"
    thread_limit: int = defaults.TIMEOUT_THREAD_LIMIT

    CHECKS: ClassVar[Checks] = {
        "seconds": partial(validate.seconds, positive=True),
        "mode": partial(validate.choice, options=_MODES),
        "thread_limit": validate.count,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class Timeout(Scoped):
    """Bound a call to ``seconds`` (and to the ambient deadline); see
    [Timeouts and deadlines][guide-timeouts].

    On the request path a timeout is one step: :meth:`scope` works out the call's budget and
    hands the drivers a :class:`~floodwall._core.timebox.Timebox`, which cancels the task (or
    arms the alarm, or abandons the thread) at the deadline.
    """

    kind = "timeout"

    def __init__(
        self,
        seconds: float,
        *,
        name: str = "timeout",
        mode: SyncMode = "auto",
        thread_limit: int = defaults.TIMEOUT_THREAD_LIMIT,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = TimeoutOptions(seconds, mode, thread_limit)
        """The options (frozen); ``seconds``, ``mode`` and ``thread_limit`` are read once from
        them into the attributes of the same names, which the time box reads per call."""
        self.seconds = self.options.seconds
        self.name = validate.text("name", name)
        self.mode: SyncMode = self.options.mode
        self.thread_limit = self.options.thread_limit
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._watchdogs = Watchdogs(name, clock)
        self._abandoned = 0
        self._abandoned_lock = threading.Lock()
        self._timeouts = 0

    # -- shared -----------------------------------------------------------------------------

    def _budget(self, now: float) -> tuple[float, bool]:
        """Seconds this call may take and whether an outer deadline (not ours) decided it."""
        outer = _DEADLINE.get()
        if outer is not None:
            left = outer.remaining()
            if left < self.seconds:
                if left <= 0:
                    self._timeouts += 1
                    raise TimeoutExceeded(
                        self.name, self.seconds, "the ambient deadline had already passed"
                    )
                return left, True
        return self.seconds, False

    def _expired(self, budget: float, inherited: bool) -> TimeoutExceeded:
        self._timeouts += 1
        reason = (
            f"the ambient deadline ({budget:.3f}s left) ran out"
            if inherited
            else f"no answer within {budget:.3f}s"
        )
        if self.listeners:
            self.listeners.emit(
                Event(
                    "timeout", self.kind, self.name, self._now(), reason, figures={"budget": budget}
                )
            )
        return TimeoutExceeded(self.name, budget, reason)

    @property
    def timeouts(self) -> int:
        """Calls that ran out of time since the policy was built."""
        return self._timeouts

    # -- the step -------------------------------------------------------------------------

    def scope(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Timebox:
        """The call's time box: its own ``seconds`` or what is left of the ambient deadline."""
        start = self._now()
        budget, inherited = self._budget(start)
        return Timebox(self, start, budget, inherited)

    def _refused(self, budget: float) -> TimeoutExceeded:
        self._timeouts += 1
        return TimeoutExceeded(
            self.name,
            budget,
            f"{self._abandoned} timed-out calls are still running "
            f"(thread_limit={self.thread_limit}); refusing to start another",
        )

    def _on_abandoned(self, worker: str, budget: float, count: int) -> None:
        if self.listeners:
            self.listeners.emit(
                Event(
                    "thread_abandoned",
                    self.kind,
                    self.name,
                    self._now(),
                    f"worker {worker} still running after {budget:.3f}s",
                    figures={"abandoned": count, "thread_limit": self.thread_limit},
                )
            )

    @property
    def abandoned(self) -> int:
        """Worker threads of ``mode="thread"`` calls that timed out and are still running."""
        return self._abandoned

    def describe(self) -> str:
        return f"Timeout({self.seconds:g}s)"
