"""Waiting for a turn on a store's connections without waiting behind a stuck server.

A call that finds every connection busy waits for one to free up. Behind a busy but healthy
server that is load: calls keep succeeding, and a wait longer than the store's ``timeout`` is
no failure. Behind a frozen server it is the outage itself: nothing succeeds, and each wave of
waiters would hold its callers one more timeout. So a waiter gives up when no call on those
connections has *succeeded* for ``timeout`` since it began waiting (failures, such as the
timed-out calls of a frozen server, are no progress): at most ``timeout`` behind a stuck
server, as long as the load needs behind a busy one.

Before a first success the store is connecting, not stuck: a waiter waits for a free slot, or
at most ``cold`` seconds when its caller has a bound of its own then (PostgreSQL's whole call).
The call that got its turn ends by the same rule (:func:`deadline`): its wait counts in its
bound unless calls succeeded meanwhile, so the turn and the call together take at most
``timeout`` past the call's start or the server's last answer, never a wait plus a whole bound.

Waiters take turns first come, first served. A freed slot is handed to the longest waiter
(:class:`Turns` for threads; :class:`asyncio.Semaphore` does the same for tasks, and an async
waiter keeps its place across the progress rule's re-checks), so a newcomer never takes a slot
a waiter was promised: behind a busy store each wait stays near (callers ahead / connections)
x the time of a call, where :class:`threading.Semaphore` let a waiter lose to newcomers again
and again (a 1.3 s fair wait became 3.6-3.8 s in ``test_store_faults_postgres.py``).

Time is injected: every instant here is read from the clock a :class:`Progress` was made with
(the store's, :data:`~floodwall.SYSTEM_CLOCK` by default), so a :class:`~floodwall.FakeClock`
decides when a waiter gives up. The waits themselves are real (a lock's timed acquire, an event
loop timer) and last what that clock says is left: on a fake clock a waiter re-checks the rule
after that long in real time and sees the time the test set.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque

from floodwall._core.clock import SYSTEM_CLOCK, Clock

__all__ = ["Progress", "Turns", "deadline", "take_turn", "take_turn_async"]


class Progress:
    """When a call last succeeded on a set of connections (seconds on ``clock``, whose
    ``monotonic()`` every wait on these connections reads too)."""

    __slots__ = ("at", "clock")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.at = -math.inf
        self.clock = clock

    def succeeded(self) -> None:
        self.at = self.clock.monotonic()

    def until(self, began: float, timeout: float) -> float:
        """When a waiter that began at ``began`` gives up, as things stand: never before a
        first success (the first connections are being made: slow, not stuck)."""
        if self.at == -math.inf:
            return math.inf
        return max(began, self.at) + timeout


def deadline(began: float, timeout: float, progress: Progress) -> float:
    """When a call that began at ``began`` and has just got its turn must be done: ``timeout``
    after it began, or after the last call that succeeded while it waited, whichever is later
    (the store answered meanwhile: the wait was load, not an outage). The same instant its wait
    would have given up at (:meth:`Progress.until`), so behind a frozen server a call ends at
    most ``timeout`` after it began or after the freeze, however long it queued for its turn."""
    return max(began, progress.at) + timeout


class Turns:
    """At most ``size`` holders at a time, the waiters served first come, first served.

    A release hands its slot straight to the longest waiter (it wakes holding it), so a
    newcomer takes a slot only when nobody waits. Each waiter blocks on a lock of its own
    (a ticket, held until the slot is handed over); a waiter that gives up leaves the queue,
    or, when the slot was handed to it at that instant, hands it on (:meth:`leave`). Taking a
    free slot costs one uncontended lock, like :meth:`threading.Semaphore.acquire`."""

    __slots__ = ("_free", "_lock", "_queue", "_size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._size = self._free = size
        self._lock = threading.Lock()
        self._queue: deque[threading.Lock] = deque()

    def take(self) -> bool:
        """Take a free slot if nobody waits for one; never blocks."""
        with self._lock:
            if self._free and not self._queue:
                self._free -= 1
                return True
            return False

    def join(self) -> threading.Lock:
        """A ticket: unlocked once the slot is this caller's (at once when one is free and
        nobody waits), else queued behind every waiter before it."""
        ticket = threading.Lock()
        with self._lock:
            if self._free and not self._queue:
                self._free -= 1
            else:
                ticket.acquire()
                self._queue.append(ticket)
        return ticket

    def release(self) -> None:
        """Give a slot back: to the longest waiter, else to the free ones."""
        with self._lock:
            self._hand_on()

    def leave(self, ticket: threading.Lock) -> None:
        """Stop waiting on ``ticket``: out of the queue, or, if its slot was handed over
        meanwhile, that slot to the next waiter (or back): giving up never loses a slot."""
        with self._lock:
            try:
                self._queue.remove(ticket)
            except ValueError:
                self._hand_on()

    @property
    def waiting(self) -> int:
        """How many callers wait for a slot."""
        return len(self._queue)

    def _hand_on(self) -> None:
        if self._queue:
            self._queue.popleft().release()
        elif self._free < self._size:
            self._free += 1
        else:
            raise ValueError("Turns released more often than taken")


def take_turn(turns: Turns, timeout: float, progress: Progress, cold: float = math.inf) -> bool:
    """Take one of ``turns``, in arrival order; False when nothing succeeded for ``timeout``
    meanwhile, or, before a first success, after ``cold`` seconds (default: as long as it
    takes). A waiter keeps its place in the queue while the rule lets it wait. Instants are
    read from ``progress.clock``; the wait begins before the waiter queues."""
    if turns.take():
        return True
    now = progress.clock.monotonic
    began = now()
    ticket = turns.join()
    while True:
        left = _until(progress, began, timeout, cold) - now()
        if left <= 0:
            turns.leave(ticket)
            return False
        if ticket.acquire(timeout=min(left, threading.TIMEOUT_MAX)):
            return True


async def take_turn_async(
    slots: asyncio.Semaphore, bound: float, progress: Progress, cold: float = math.inf
) -> bool:
    """:func:`take_turn` for an :class:`asyncio.Semaphore` (first come, first served itself),
    ``bound`` the store's timeout. A free slot costs no suspension. The waiter awaits one
    acquire, so it keeps its place: a timer re-checks the rule when it would give up, and only
    then cancels the acquire (a slot handed over at that instant goes on to the next waiter)."""
    if not slots.locked():
        await slots.acquire()
        return True
    now = progress.clock.monotonic
    began = now()
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(None) as scope:

            def recheck() -> None:
                nonlocal timer
                left = _until(progress, began, bound, cold) - now()
                if left <= 0:
                    scope.reschedule(loop.time())  # give up now: cancels the acquire
                elif left < math.inf:
                    timer = loop.call_later(left, recheck)

            recheck()
            await slots.acquire()
    except TimeoutError:
        return False
    finally:
        if timer is not None:
            timer.cancel()
    return True


def _until(progress: Progress, began: float, timeout: float, cold: float) -> float:
    until = progress.until(began, timeout)
    return began + cold if until == math.inf else until
