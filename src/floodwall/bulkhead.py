"""Bulkheads: a slow dependency can only take down the share of resources given to it.

The seeds' product page has 100 worker threads and three dependencies. Unisolated, a review
service that slows down holds every thread in turn until the page serves nothing; with bulkheads
of 20 / 30 / 20, reviews can hold at most 20 and the other two keep their latency.

:class:`Bulkhead` (semaphore isolation) bounds the calls *in flight* to a dependency:

* at most ``max_concurrent`` calls run at once; a call that finds them all busy waits in a FIFO
  queue of at most ``max_queue`` callers for at most ``max_wait`` seconds (never past the
  ambient :func:`floodwall.deadline`); ``max_wait=0`` (the default) refuses at once;
* a refusal is a :class:`~floodwall.BulkheadFullError` carrying the figures (``max_concurrent``,
  ``max_queue``, ``in_flight``, ``queued``) and the reason ("full", "queue full", "waited …");
* admission is strictly first come, first served: a freed slot is handed to the oldest waiter
  directly, and a newcomer never overtakes a waiter (no barging, also when waiters give up or
  are cancelled);
* sync and async callers share the same slots and the same queue (a thread waits on its own
  lock, a task on a future), so one bulkhead can guard a dependency used from both worlds.

Cost: uncontended, two short lock sections per call (admit, release) and no allocation;
refusing is as cheap. Waiting allocates one waiter; its timeout runs on the bulkhead's clock
(a :class:`~floodwall.FakeClock` drives it in tests).

:class:`ThreadPoolBulkhead` (thread-pool isolation) runs *sync* callables on threads of its own,
for clients that can hang without honouring any timeout: see its docstring for the price.
:func:`pool_size` sizes either from the seeds' rule, ``peak RPS × p99 latency + buffer``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock, SystemClock
from floodwall._core.errors import BulkheadFullError, ConfigError, TimeoutExceeded
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.policy import Policy
from floodwall._core.validate import count as _limit
from floodwall._core.window import WindowSnapshot
from floodwall.context import _DEADLINE

__all__ = ["Bulkhead", "ThreadPoolBulkhead", "pool_size"]

P = ParamSpec("P")
R = TypeVar("R")

_INF = math.inf
_PENDING, _GRANTED, _GONE = 0, 1, 2
_POLL = 0.01
"""Real seconds between clock readings of a sync waiter whose clock is not the system clock."""


def _wait_seconds(name: str, value: float | None) -> float:
    if value is None:
        return _INF
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0 or None, got {value!r}")
    return float(value)


class _Waiter:
    """A caller queued for a slot: a thread (``lock``) or a task (``future``)."""

    __slots__ = ("future", "lock", "loop", "state", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.state = _PENDING
        self.loop = loop
        self.thread = threading.get_ident()
        self.future: asyncio.Future[bool] | None = None
        self.lock: threading.Lock | None = None
        if loop is None:
            self.lock = threading.Lock()
            self.lock.acquire()
        else:
            self.future = loop.create_future()

    def wake(self, granted: bool) -> None:
        """Tell the waiter how its wait ended (bulkhead lock held; never blocks)."""
        if self.lock is not None:
            self.lock.release()
            return
        future = self.future
        assert future is not None
        assert self.loop is not None
        if threading.get_ident() == self.thread:
            if not future.done():
                future.set_result(granted)
        else:
            self.loop.call_soon_threadsafe(_resolve, future, granted)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _resolve(future: asyncio.Future[bool], granted: bool) -> None:
    if not future.done():
        future.set_result(granted)


class Bulkhead(Policy):
    """Semaphore isolation with a bounded FIFO wait queue (see [Isolation][guide-isolation]).

    Defaults (Hystrix's semaphore isolation): ``max_concurrent=10``, ``max_queue=0``,
    ``max_wait=0`` (refuse at once). ``max_wait=None`` waits without a time bound (still bounded
    by the ambient deadline and the queue length).

    Use it as a decorator, with ``call`` / ``call_async``, in a :class:`~floodwall.Pipeline`,
    or as a context manager (``with bulkhead:`` / ``async with bulkhead:``).
    """

    kind = "bulkhead"

    def __init__(
        self,
        name: str = "bulkhead",
        *,
        max_concurrent: int = defaults.BULKHEAD_MAX_CONCURRENT,
        max_queue: int = defaults.BULKHEAD_MAX_QUEUE,
        max_wait: float | None = defaults.BULKHEAD_MAX_WAIT,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = name
        self.max_concurrent = _limit("max_concurrent", max_concurrent, 1)
        self.max_queue = _limit("max_queue", max_queue, 0)
        self.max_wait = _wait_seconds("max_wait", max_wait)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._real_clock = isinstance(clock, SystemClock)
        self._never_waits = self.max_queue == 0 or self.max_wait == 0
        lock = threading.Lock()
        self._lock_acquire = lock.acquire
        self._lock_release = lock.release
        self._in_flight = 0
        self._queued = 0
        self._waiters: deque[_Waiter] = deque()
        self._rejections = itertools.count()

    # -- admission (lock held for a few lines only) -----------------------------------------

    def _try_enter(self) -> bool:
        self._lock_acquire()
        if self._in_flight < self.max_concurrent:
            self._in_flight += 1
            self._lock_release()
            return True
        self._lock_release()
        return False

    def release(self) -> None:
        """Give a slot back: to the oldest waiter if there is one, else to the pool."""
        self._lock_acquire()
        try:
            waiters = self._waiters
            while waiters:
                waiter = waiters.popleft()
                if waiter.state == _PENDING:
                    self._queued -= 1
                    try:
                        waiter.wake(True)
                    except RuntimeError:  # its event loop is closed: nobody is waiting there
                        waiter.state = _GONE
                        continue
                    waiter.state = _GRANTED
                    return
            self._in_flight -= 1
        finally:
            self._lock_release()

    def _budget(self) -> float:
        """How long a caller may wait: ``max_wait``, cut by the ambient deadline."""
        budget = self.max_wait
        if budget > 0:
            outer = _DEADLINE.get()
            if outer is not None:
                budget = min(budget, outer.remaining())
        return budget

    def _enqueue(self, loop: asyncio.AbstractEventLoop | None, budget: float) -> _Waiter | None:
        """Queue a waiter; ``None`` when a slot freed up meanwhile (it is taken)."""
        self._lock_acquire()
        try:
            if self._in_flight < self.max_concurrent:
                self._in_flight += 1
                return None
            if budget > 0 and self._queued < self.max_queue:
                waiter = _Waiter(loop)
                self._waiters.append(waiter)
                self._queued += 1
                return waiter
            error = self._full("full" if budget <= 0 or not self.max_queue else "queue full")
        finally:
            self._lock_release()
        raise self._reject(error)

    def _give_up(self, waiter: _Waiter) -> bool:
        """The waiter stops waiting; True if it got a slot first (it then holds it)."""
        self._lock_acquire()
        try:
            if waiter.state == _GRANTED:
                return True
            if waiter.state == _PENDING:
                waiter.state = _GONE
                self._queued -= 1
            return False
        finally:
            self._lock_release()

    def _full(self, reason: str) -> BulkheadFullError:
        """The refusal with the figures (lock held, so they are consistent)."""
        return BulkheadFullError(
            self.name,
            reason,
            None,
            self.max_concurrent,
            self.max_queue,
            self._in_flight,
            self._queued,
        )

    def _reject(self, error: BulkheadFullError) -> BulkheadFullError:
        """Count the refusal and tell the listeners (lock not held)."""
        next(self._rejections)
        if self.listeners:
            self._emit(error)
        return error

    def _emit(self, error: BulkheadFullError) -> None:
        self.listeners.emit(
            Event(
                kind="rejected",
                source=self.kind,
                name=self.name,
                time=self.clock.monotonic(),
                reason=str(error),
                figures={
                    "max_concurrent": error.max_concurrent,
                    "max_queue": error.max_queue,
                    "in_flight": error.in_flight,
                    "queued": error.queued,
                },
            )
        )

    def _timed_out(self, budget: float) -> BulkheadFullError:
        self._lock_acquire()
        try:
            error = self._full(f"no slot within {budget:.3f}s")
        finally:
            self._lock_release()
        return self._reject(error)

    # -- sync -------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take a slot (waiting as configured) or raise :class:`BulkheadFullError`."""
        if self._try_enter():
            return
        budget = self._budget()
        waiter = self._enqueue(None, budget)
        if waiter is None:
            return
        lock = waiter.lock
        assert lock is not None
        if budget == _INF:
            lock.acquire()
            return
        if self._real_clock:
            if lock.acquire(timeout=min(budget, threading.TIMEOUT_MAX)):
                return
        else:
            until = self.clock.monotonic() + budget
            while True:
                left = until - self.clock.monotonic()
                if left <= 0:
                    break
                if lock.acquire(timeout=min(left, _POLL)):
                    return
        if not self._give_up(waiter):
            raise self._timed_out(budget)

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._lock_acquire()
        if self._in_flight < self.max_concurrent:
            self._in_flight += 1
            self._lock_release()
        elif self._never_waits:  # refusing is the hot path of an outage: one lock, no frames
            error = BulkheadFullError(
                self.name,
                "full",
                None,
                self.max_concurrent,
                self.max_queue,
                self._in_flight,
                self._queued,
            )
            self._lock_release()
            next(self._rejections)
            if self.listeners:
                self._emit(error)
            raise error
        else:
            self._lock_release()
            self.acquire()
        try:
            return fn(*args, **kwargs)
        finally:
            self.release()

    def __enter__(self) -> Bulkhead:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- async ------------------------------------------------------------------------------

    async def acquire_async(self) -> None:
        """:meth:`acquire` for coroutines: waits on a future, not a thread."""
        if self._try_enter():
            return
        budget = self._budget()
        waiter = self._enqueue(asyncio.get_running_loop(), budget)
        if waiter is None:
            return
        future = waiter.future
        assert future is not None
        timer: asyncio.TimerHandle | asyncio.Task[None] | None = None
        if budget != _INF:
            loop = asyncio.get_running_loop()
            if self._real_clock:
                timer = loop.call_later(budget, self._expire, waiter)
            else:
                timer = loop.create_task(self._expire_later(waiter, budget))
        try:
            granted = await future
        except asyncio.CancelledError:
            if self._give_up(waiter):
                self.release()  # granted while being cancelled: pass the slot on
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not granted:
            raise self._timed_out(budget)

    def _expire(self, waiter: _Waiter) -> None:
        if not self._give_up(waiter):
            waiter.wake(False)

    async def _expire_later(self, waiter: _Waiter, budget: float) -> None:
        await self.clock.async_sleep(budget)
        self._expire(waiter)

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        self._lock_acquire()
        if self._in_flight < self.max_concurrent:
            self._in_flight += 1
            self._lock_release()
        elif self._never_waits:
            error = BulkheadFullError(
                self.name,
                "full",
                None,
                self.max_concurrent,
                self.max_queue,
                self._in_flight,
                self._queued,
            )
            self._lock_release()
            next(self._rejections)
            if self.listeners:
                self._emit(error)
            raise error
        else:
            self._lock_release()
            await self.acquire_async()
        try:
            return await fn(*args, **kwargs)
        finally:
            self.release()

    async def __aenter__(self) -> Bulkhead:
        await self.acquire_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- observers --------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Calls holding a slot now."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """Callers waiting for a slot now."""
        return self._queued

    @property
    def available(self) -> int:
        """Free slots now."""
        return self.max_concurrent - self._in_flight

    @property
    def rejected(self) -> int:
        """Calls refused since the bulkhead was built."""
        return int(repr(self._rejections)[6:-1])

    def describe(self) -> str:
        wait = "inf" if self.max_wait == _INF else f"{self.max_wait:g}s"
        return (
            f"Bulkhead({self.name!r}, max_concurrent={self.max_concurrent}, "
            f"max_queue={self.max_queue}, max_wait={wait})"
        )


class ThreadPoolBulkhead(Policy):
    """Thread-pool isolation: sync calls run on ``max_workers`` threads owned by this bulkhead.

    ``call(fn, ...)`` submits ``fn`` to the pool and waits for its result at most ``timeout``
    seconds (and never past the ambient deadline): past that the caller gets
    :class:`~floodwall.TimeoutExceeded` and its thread is free again, even if ``fn`` hangs
    forever. That is the point: a sync client stuck in a socket read without a timeout holds one
    of *this* pool's threads, never one of the caller's. At most ``max_workers`` calls run and
    ``max_queue`` wait; beyond that :class:`~floodwall.BulkheadFullError` (a full pool of hung
    calls turns into fast refusals, isolated from every other dependency's pool).

    ``await run_async(fn, ...)`` does the same for async code calling a blocking function.
    Coroutine functions need no thread pool: ``call_async`` raises ``TypeError`` and points to
    :class:`Bulkhead`.

    **The price.** Each pool owns up to ``max_workers`` OS threads (started on demand, each with
    its own stack: about 8 MiB of address space and tens of KiB resident), and each call pays
    two thread hand-offs (tens of µs, see ``docs/isolation.md``), where a :class:`Bulkhead`
    costs well under a µs. Threads are shared by no other dependency. The seeds' post-mortem is
    the warning: a pool per service for 50 services was 100 threads and 2 GB for protection that
    five services needed. Use it only for sync clients that can hang and cannot be given a
    timeout; :class:`Bulkhead` for everything else.

    The context of the caller (``floodwall.deadline``, ``remaining()``) is copied into the
    worker. ``shutdown()`` (or leaving ``with pool:``) stops taking calls, cancels queued ones
    and, with ``wait=True``, waits for running ones; threads of hung calls are daemons of the
    executor and end with the call. Defaults (Hystrix's): 10 workers, 5 queued.
    """

    kind = "thread_pool_bulkhead"

    def __init__(
        self,
        name: str = "thread_pool",
        *,
        max_workers: int = defaults.THREAD_POOL_WORKERS,
        max_queue: int = defaults.THREAD_POOL_QUEUE,
        timeout: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = name
        self.clock = clock
        self.max_workers = _limit("max_workers", max_workers, 1)
        self.max_queue = _limit("max_queue", max_queue, 0)
        self.timeout = _wait_seconds("timeout", timeout)
        self.listeners = Listeners(listeners)
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_workers, thread_name_prefix=f"floodwall-{name}"
        )
        self._lock = threading.Lock()
        self._admitted = 0
        self._closed = False
        self._rejections = itertools.count()
        self._timeouts = 0

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Run ``fn`` on the pool; its future. :class:`BulkheadFullError` if the pool is full."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"ThreadPoolBulkhead {self.name!r} is shut down")
            full = self._admitted >= self.max_workers + self.max_queue
            if full:
                running = min(self._admitted, self.max_workers)
                error = BulkheadFullError(
                    self.name,
                    "pool full",
                    None,
                    self.max_workers,
                    self.max_queue,
                    running,
                    self._admitted - running,
                )
            else:
                self._admitted += 1
        if full:
            raise self._reject(error)
        run = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        try:
            future: Future[R] = self._executor.submit(run)
        except BaseException:
            with self._lock:
                self._admitted -= 1
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Future[Any]) -> None:
        with self._lock:
            self._admitted -= 1

    def _reject(self, error: BulkheadFullError) -> BulkheadFullError:
        next(self._rejections)
        if self.listeners:
            self.listeners.emit(
                Event("rejected", self.kind, self.name, self.clock.monotonic(), str(error))
            )
        return error

    def _wait_budget(self) -> float | None:
        budget = self.timeout
        outer = _DEADLINE.get()
        if outer is not None:
            budget = min(budget, max(0.0, outer.remaining()))
        return None if budget == _INF else budget

    def _expired(self, budget: float, future: Future[Any]) -> TimeoutExceeded:
        future.cancel()  # still queued: it will never run
        self._timeouts += 1
        return TimeoutExceeded(self.name, budget, f"no result from the pool within {budget:.3f}s")

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        future = self.submit(fn, *args, **kwargs)
        budget = self._wait_budget()
        try:
            return future.result(timeout=budget)
        except FutureTimeout:
            assert budget is not None
            raise self._expired(budget, future) from None

    async def run_async(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await ``fn(*args, **kwargs)`` run on the pool (for blocking calls in async code)."""
        future = self.submit(fn, *args, **kwargs)
        budget = self._wait_budget()
        waiting = asyncio.wrap_future(future)
        waiting.add_done_callback(_retrieve)  # a result nobody awaits any more is not an error
        if budget is None:
            return await waiting
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), budget)
        except TimeoutError:
            raise self._expired(budget, future) from None

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        raise TypeError(
            f"ThreadPoolBulkhead {self.name!r} runs sync callables on threads; use "
            "`await pool.run_async(blocking_fn, ...)` for those, or a Bulkhead for coroutines"
        )

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking calls, cancel queued ones; with ``wait``, wait for running ones."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self) -> ThreadPoolBulkhead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown(wait=True)

    @property
    def in_flight(self) -> int:
        """Calls running on the pool's threads now."""
        return min(self._admitted, self.max_workers)

    @property
    def queued(self) -> int:
        """Calls waiting for a thread now."""
        return max(0, self._admitted - self.max_workers)

    @property
    def rejected(self) -> int:
        """Calls refused since the pool was built."""
        return int(repr(self._rejections)[6:-1])

    @property
    def timeouts(self) -> int:
        """Callers that stopped waiting for a result."""
        return self._timeouts

    def describe(self) -> str:
        return (
            f"ThreadPoolBulkhead({self.name!r}, max_workers={self.max_workers}, "
            f"max_queue={self.max_queue})"
        )


def pool_size(
    *,
    peak_rps: float | None = None,
    p99_latency: float | None = None,
    window: WindowSnapshot | None = None,
    buffer: int = defaults.POOL_SIZE_BUFFER,
) -> int:
    """Threads (or bulkhead slots) for a dependency: ``ceil(peak_rps × p99_latency) + buffer``.

    The seeds' rule (and Hystrix's): size from measurements, not guesses. Figures not given are
    read from ``window``, a snapshot of a time window (e.g. ``breaker.metrics()``): its p99
    latency, and its mean rate over its span (``calls / span``) as the peak, so take the
    snapshot at peak traffic or pass ``peak_rps``. Little's law underneath: the calls in flight
    are the arrival rate times the time each one takes.

    >>> pool_size(peak_rps=30, p99_latency=0.2)   # Hystrix's example: 30 rps × 0.2 s + 2
    8
    """
    if window is not None:
        if p99_latency is None:
            p99_latency = window.percentile(0.99)
            if p99_latency is None:
                raise ConfigError("window has no latency samples yet; pass p99_latency")
        if peak_rps is None:
            if not window.span > 0:
                raise ConfigError(f"window span must be > 0 to derive a rate, got {window.span}")
            peak_rps = window.calls / window.span
    if peak_rps is None or p99_latency is None:
        raise ConfigError("pool_size needs peak_rps and p99_latency, or a window to read them from")
    if not 0 <= peak_rps < _INF or not 0 <= p99_latency < _INF:
        raise ConfigError(
            f"peak_rps and p99_latency must be finite and >= 0, got {peak_rps!r}, {p99_latency!r}"
        )
    _limit("buffer", buffer, 0)
    return max(1, math.ceil(peak_rps * p99_latency - 1e-9) + buffer)
