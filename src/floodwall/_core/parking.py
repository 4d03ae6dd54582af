"""A bounded queue of parked callers, and the step that parks one until it is served or gives up.

A gate that can make callers wait for capacity (a :class:`~floodwall.Bulkhead`'s FIFO queue, an
:class:`~floodwall.adaptive.AdaptiveLimiter`'s LIFO backlog) owns a :class:`Lot` and raises
``Wait(Park(...))`` from ``admit`` when nothing is free. The driver performs the :class:`Park`
step: its ``run`` parks the thread on a lock of its own, its ``arun`` parks the task on a
future. Both worlds share one lot, so threads and tasks queue in one order.

The owner grants a parked caller a *value* (``None`` for a bulkhead slot, a token for a
limiter) under its lock with :meth:`Lot.hand`; the waiter wakes with it. A waiter whose budget
runs out or that is cancelled leaves with :meth:`Lot.leave`; if a grant reached it first, a
timed-out waiter keeps it (it was served in time), a cancelled one passes it on through the
owner's ``pass_on``: a slot is never lost between a grant and a give-up.

Bounds: at most ``size`` waiters (the owner refuses beyond), each waiting at most its budget
on the owner's clock; one lock or one future per waiter, freed when it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, Literal, Protocol

from floodwall._core.clock import Clock, SystemClock
from floodwall._core.steps import Step

__all__ = ["TIMED_OUT", "Lot", "Owner", "Park", "TaskWaiter", "ThreadWaiter", "Waiter"]

_PENDING, _GRANTED, _GONE = 0, 1, 2
_INF = float("inf")
_POLL = 0.01
"""Real seconds between clock readings of a thread waiting on a clock that is not the system's
(a :class:`~floodwall.FakeClock` moves only when a test advances it)."""


class _TimedOut:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT: Final = _TimedOut()
"""What a :class:`Park` step returns when its budget ran out before a grant."""


class Waiter:
    """One parked caller: its ``tag`` (what it asks for, e.g. a partition) and, once granted,
    its ``value``. Subclasses say how it is woken."""

    __slots__ = ("state", "tag", "value")

    def __init__(self, tag: Any = None) -> None:
        self.state = _PENDING
        self.tag = tag
        self.value: Any = None

    def wake(self) -> None:
        """Tell the caller it was granted (owner's lock held; never blocks)."""
        raise NotImplementedError


class ThreadWaiter(Waiter):
    """A thread parked on a lock of its own, released to wake it."""

    __slots__ = ("lock",)

    def __init__(self, tag: Any = None) -> None:
        super().__init__(tag)
        self.lock = threading.Lock()
        self.lock.acquire()

    def wake(self) -> None:
        self.lock.release()

    def sleep(self, clock: Clock, budget: float) -> bool:
        """Wait for :meth:`wake` at most ``budget`` seconds on ``clock``; True if woken."""
        lock = self.lock
        if budget == _INF:
            return lock.acquire()
        if isinstance(clock, SystemClock):
            return lock.acquire(timeout=min(budget, threading.TIMEOUT_MAX))
        until = clock.monotonic() + budget
        while (left := until - clock.monotonic()) > 0:
            if lock.acquire(timeout=min(left, _POLL)):
                return True
        return False


class TaskWaiter(Waiter):
    """A task parked on a future of its loop; woken from any thread."""

    __slots__ = ("future", "loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, tag: Any = None) -> None:
        super().__init__(tag)
        self.loop = loop
        self.thread = threading.get_ident()
        self.future: asyncio.Future[bool] = loop.create_future()

    def wake(self) -> None:
        """Resolve the future: directly from the loop's thread, else through the loop (raises
        ``RuntimeError`` when the loop is closed: nobody waits there any more)."""
        if threading.get_ident() == self.thread:
            _resolve(self.future, True)
        else:
            self.loop.call_soon_threadsafe(_resolve, self.future, True)

    async def sleep(self, clock: Clock, budget: float, lot: Lot) -> bool:
        """Wait for :meth:`wake` at most ``budget`` seconds on ``clock``; True if woken. On
        expiry the waiter leaves ``lot`` (unless a grant came first)."""
        timer: asyncio.TimerHandle | asyncio.Task[None] | None = None
        if budget != _INF:
            if isinstance(clock, SystemClock):
                timer = self.loop.call_later(budget, self._expire, lot)
            else:
                timer = self.loop.create_task(self._expire_later(clock, budget, lot))
        try:
            return await self.future
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, lot: Lot) -> None:
        if not lot.leave(self)[0]:
            _resolve(self.future, False)

    async def _expire_later(self, clock: Clock, budget: float, lot: Lot) -> None:
        await clock.async_sleep(budget)
        self._expire(lot)


def _resolve(future: asyncio.Future[bool], granted: bool) -> None:
    if not future.done():
        future.set_result(granted)


class Lot:
    """The parked waiters of one owner, served oldest first (``"fifo"``) or newest first.

    Every method but :meth:`leave` runs under the owner's ``lock``, the one its admission
    decisions take, so "is anything free? else park" is one atomic step.
    """

    __slots__ = ("lifo", "lock", "size", "waiters")

    def __init__(
        self, lock: threading.Lock, size: int, order: Literal["fifo", "lifo"] = "fifo"
    ) -> None:
        self.lock = lock
        self.size = size
        self.lifo = order == "lifo"
        self.waiters: deque[Waiter] = deque()

    def __len__(self) -> int:
        return len(self.waiters)

    def park(self, waiter: Waiter) -> bool:
        """Queue ``waiter`` if there is room (lock held)."""
        if len(self.waiters) >= self.size:
            return False
        self.waiters.append(waiter)
        return True

    def next(self) -> Waiter | None:
        """The waiter to serve next, or ``None`` (lock held)."""
        waiters = self.waiters
        if not waiters:
            return None
        return waiters[-1] if self.lifo else waiters[0]

    def hand(self, waiter: Waiter, value: Any) -> bool:
        """Grant ``value`` to ``waiter``, the one :meth:`next` returned, and wake it (lock
        held). False when it cannot be woken (its loop is closed): it is dropped instead."""
        if self.lifo:
            self.waiters.pop()
        else:
            self.waiters.popleft()
        waiter.state = _GRANTED
        waiter.value = value  # before waking: a woken thread reads it at once
        try:
            waiter.wake()
        except RuntimeError:
            waiter.state = _GONE
            waiter.value = None
            return False
        return True

    def leave(self, waiter: Waiter) -> tuple[bool, Any]:
        """``waiter`` stops waiting: ``(True, value)`` if it was granted first (it holds the
        grant), else ``(False, None)`` and it is out of the queue. Takes the lock."""
        with self.lock:
            if waiter.state == _GRANTED:
                return True, waiter.value
            if waiter.state == _PENDING:
                waiter.state = _GONE
                self.waiters.remove(waiter)
            return False, None


class Owner(Protocol):
    """What a :class:`Park` step asks of the gate that owns the lot."""

    def join(self, waiter: Waiter, budget: float) -> bool:
        """Under the owner's lock: grant at once (set ``waiter.value``, True), park it in the
        lot (False), or raise the refusal. An owner may also settle at once with a value that
        means "refused" (True), which its ``resume`` then turns into a refusal. ``budget`` is
        the wait allowed (``<= 0``: none)."""

    def pass_on(self, value: Any) -> None:
        """Give back a grant its waiter will not use (it was cancelled as the grant came)."""


class Park(Step):
    """Park the caller in ``lot`` for at most ``budget`` seconds on ``clock``.

    Returns the granted value, or :data:`TIMED_OUT`. A cancellation (or any interruption)
    while parked leaves the lot and passes a grant that came meanwhile on.
    """

    __slots__ = ("budget", "clock", "lot", "owner", "tag")

    def __init__(
        self, owner: Owner, lot: Lot, clock: Clock, budget: float, tag: Any = None
    ) -> None:
        self.owner = owner
        self.lot = lot
        self.clock = clock
        self.budget = budget
        self.tag = tag

    def run(self, call: Callable[[], Any] = lambda: None) -> Any:
        waiter = ThreadWaiter(self.tag)
        if self.owner.join(waiter, self.budget):
            return waiter.value
        with self._giving_up(waiter):
            woken = waiter.sleep(self.clock, self.budget)
        return waiter.value if woken else self._timed_out(waiter)

    async def arun(self, call: Callable[[], Awaitable[Any]] | None = None) -> Any:
        waiter = TaskWaiter(asyncio.get_running_loop(), self.tag)
        if self.owner.join(waiter, self.budget):
            return waiter.value
        with self._giving_up(waiter):
            woken = await waiter.sleep(self.clock, self.budget, self.lot)
        return waiter.value if woken else self._timed_out(waiter)

    @contextlib.contextmanager
    def _giving_up(self, waiter: Waiter) -> Iterator[None]:
        """Interrupted (cancelled) while parked: leave, and pass a grant that came on."""
        try:
            yield
        except BaseException:
            granted, value = self.lot.leave(waiter)
            if granted:
                self.owner.pass_on(value)
            raise

    def _timed_out(self, waiter: Waiter) -> Any:
        granted, value = self.lot.leave(waiter)
        return value if granted else TIMED_OUT

    def __repr__(self) -> str:
        return f"Park({self.budget:g}s)"
