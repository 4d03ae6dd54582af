"""Bulkheads: a slow dependency can only take down the share of resources given to it.

The seeds' product page has 100 worker threads and three dependencies. Unisolated, a review
service that slows down holds every thread in turn until the page serves nothing; with bulkheads
of 20 / 30 / 20, reviews can hold at most 20 and the other two keep their latency.

:class:`Bulkhead` (semaphore isolation) bounds the calls *in flight* to a dependency:

* at most ``max_concurrent`` calls run at once; a call that finds them all busy waits in a FIFO
  queue of at most ``max_queue`` callers for at most ``max_wait`` seconds (never past the
  ambient :func:`floodwall.deadline`); ``max_wait=0`` (the default) refuses at once; a
  positive ``max_wait`` with ``max_queue=0`` is refused at construction (:class:`ConfigError`):
  with no queue nobody can wait, and refusing at once would silently ignore the wait the caller
  asked for (resilience4j's semaphore bulkhead lets every caller wait; floodwall bounds the
  waiters, so it asks how many);
* ``bypass=predicate`` (concurrency-limits' ``bypassResolver``): a call for which
  ``predicate(*args, **kwargs)`` is true runs without taking a slot and is not counted (health
  checks, an operator's call that must get through a full bulkhead);
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

import contextvars
import functools
import math
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, ClassVar, ParamSpec, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Flow, Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.drivers import wait_async, wait_sync
from floodwall._core.errors import BulkheadFullError, ConfigError, TimeoutExceeded
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.offload import Offload
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.parking import TIMED_OUT, Lot, Park, Waiter
from floodwall._core.steps import FlowSteps, Step, Wait
from floodwall._core.tally import Tally
from floodwall._core.validate import count, seconds
from floodwall._core.validate import count as _limit
from floodwall._core.window import WindowSnapshot
from floodwall.context import _DEADLINE

__all__ = ["Bulkhead", "BulkheadOptions", "ThreadPoolBulkhead", "pool_size"]

P = ParamSpec("P")
R = TypeVar("R")

_INF = math.inf


def _wait_seconds(name: str, value: float | None) -> float:
    if value is None:
        return _INF
    return seconds(name, value, infinite=True)


@dataclass(frozen=True, slots=True)
class BulkheadOptions:
    """A :class:`Bulkhead`'s options (defaults: Hystrix's semaphore isolation), validated once.

    ``max_wait=None`` waits without a time bound; a positive ``max_wait`` needs
    ``max_queue >= 1`` (nobody can wait without a queue).
    """

    max_concurrent: int = defaults.BULKHEAD_MAX_CONCURRENT
    max_queue: int = defaults.BULKHEAD_MAX_QUEUE
    max_wait: float | None = defaults.BULKHEAD_MAX_WAIT
    bypass: Callable[..., bool] | None = None

    CHECKS: ClassVar[Checks] = {
        "max_concurrent": count,
        "max_queue": partial(count, minimum=0),
        "max_wait": optional(partial(seconds, infinite=True)),
        "bypass": optional(partial(validate.function, what="a callable of the call's arguments")),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.max_queue == 0 and self.max_wait is not None and self.max_wait > 0:
            raise ConfigError(
                f"max_wait={self.max_wait:g} needs max_queue >= 1 (callers wait in the queue),"
                " got max_queue=0; pass max_queue=N to let N callers wait, or max_wait=0"
            )


_BYPASSED = object()
"""The permit of a call the ``bypass`` predicate let through without a slot."""
_NO_CALL: dict[str, Any] = {}
"""The keyword arguments of a direct :meth:`Bulkhead.acquire`: no call to ask ``bypass`` about."""


class Bulkhead(Gate):
    """Semaphore isolation with a bounded FIFO wait queue (see [Isolation][guide-isolation]).

    Defaults (Hystrix's semaphore isolation): ``max_concurrent=10``, ``max_queue=0``,
    ``max_wait=0`` (refuse at once). ``max_wait=None`` waits without a time bound (still bounded
    by the ambient deadline and the queue length).

    Use it as a decorator, with ``call`` / ``call_async``, in a :class:`~floodwall.Pipeline`,
    or as a context manager (``with bulkhead:`` / ``async with bulkhead:``).

    As a gate: ``admit`` takes a free slot, refuses, or raises ``Wait(Park(...))`` to queue the
    caller in the bulkhead's :class:`~floodwall._core.parking.Lot` (the driver parks the thread
    or the task, then ``resume`` turns a timed-out wait into the refusal); ``record`` gives the
    slot back (:meth:`release`), whatever the outcome.
    """

    kind = "bulkhead"
    untimed = True  # admit and record never read the time: no clock readings for them

    def __init__(
        self,
        name: str = "bulkhead",
        *,
        max_concurrent: int = defaults.BULKHEAD_MAX_CONCURRENT,
        max_queue: int = defaults.BULKHEAD_MAX_QUEUE,
        max_wait: float | None = defaults.BULKHEAD_MAX_WAIT,
        bypass: Callable[..., bool] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = BulkheadOptions(
            max_concurrent,
            max_queue,
            max_wait,
            bypass,
        )
        """The options (frozen): read once into the fields below."""
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._bypass = self.options.bypass
        self._max_concurrent = self.options.max_concurrent
        self._max_wait = _wait_seconds("max_wait", self.options.max_wait)
        self._never_waits = self.options.max_queue == 0 or self._max_wait == 0
        self._lock = threading.Lock()
        # admit and release take the lock with these (bound once), not `with self._lock`:
        # a `with` looks up and binds __enter__ and __exit__ on every call
        self._lock_acquire = self._lock.acquire
        self._lock_release = self._lock.release
        self._lot = Lot(self._lock, self.options.max_queue, "fifo")
        self._in_flight = 0
        self._rejections = Tally()

    # -- the admission hooks (lock held for a few lines only) -------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        """Take a free slot, or refuse, or raise ``Wait`` to queue for one; a call ``bypass``
        lets through takes nothing (its permit tells :meth:`record` there is nothing to give).

        The refusal is raised here, not in a helper: an exception costs a few hundred ns per
        frame it leaves, and refusing is the hot path of an outage ("bulkhead refusal, all
        slots busy" in benchmarks/bench_bulkhead.py).
        """
        if self._bypass is not None and kwargs is not _NO_CALL and self._bypass(*args, **kwargs):
            return _BYPASSED
        self._lock_acquire()
        try:
            if self._in_flight < self._max_concurrent:
                self._in_flight += 1
                return None
            error = self._full("full") if self._never_waits else None
        finally:
            self._lock_release()
        if error is not None:
            raise self._reject(error)
        raise Wait(Park(self, self._lot, self.clock, self._budget()))

    def resume(self, step: Step, value: Any, now: float) -> None:
        """After the wait: the slot was handed over, or the budget ran out (refuse)."""
        if value is TIMED_OUT:
            assert isinstance(step, Park)
            raise self._timed_out(step.budget)

    def record(
        self,
        permit: Any,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Give the slot back, whatever the outcome (a bypassed call took none)."""
        if permit is not _BYPASSED:
            self.release()

    def join(self, waiter: Waiter, budget: float) -> bool:
        """The wait step's entry: a slot freed meanwhile (True), queued (False), or refused."""
        with self._lock:
            if self._in_flight < self._max_concurrent:
                self._in_flight += 1
                return True
            if budget > 0 and self._lot.park(waiter):
                return False
            queue = self.options.max_queue
            error = self._full("full" if budget <= 0 or not queue else "queue full")
        raise self._reject(error)

    def pass_on(self, value: Any) -> None:
        """A waiter cancelled as its slot came: the slot goes to the next one."""
        self.release()

    def release(self) -> None:
        """Give a slot back: to the oldest waiter if there is one, else to the pool."""
        self._lock_acquire()
        try:
            lot = self._lot
            while lot.waiters:
                if lot.hand(lot.waiters[0], None):
                    return
            self._in_flight -= 1
        finally:
            self._lock_release()

    def _budget(self) -> float:
        """How long a caller may wait: ``max_wait``, cut by the ambient deadline."""
        budget = self._max_wait
        if budget > 0:
            outer = _DEADLINE.get()
            if outer is not None:
                budget = min(budget, outer.remaining())
        return budget

    def _full(self, reason: str) -> BulkheadFullError:
        """The refusal with the figures (lock held, so they are consistent)."""
        return BulkheadFullError(
            self.name,
            reason,
            None,
            self._max_concurrent,
            self.options.max_queue,
            self._in_flight,
            len(self._lot),
        )

    def _reject(self, error: BulkheadFullError) -> BulkheadFullError:
        """Count the refusal and tell the listeners (lock not held)."""
        self._rejections.add()
        if self.listeners:
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
        return error

    def _timed_out(self, budget: float) -> BulkheadFullError:
        with self._lock:
            error = self._full(f"no slot within {budget:.3f}s")
        return self._reject(error)

    # -- direct use: the same hooks, the drivers' wait loops --------------------------------

    def acquire(self) -> None:
        """Take a slot (waiting as configured) or raise :class:`BulkheadFullError`."""
        if (wait := self._admit_now()) is not None:
            wait_sync(self, wait)

    async def acquire_async(self) -> None:
        """:meth:`acquire` for coroutines: waits on a future, not a thread."""
        if (wait := self._admit_now()) is not None:
            await wait_async(self, wait)

    def _admit_now(self) -> Wait | None:
        """:meth:`admit` outside a call: ``None`` when a slot was taken, else the wait to do."""
        try:
            self.admit(self._now(), (), _NO_CALL)
        except Wait as wait:
            return wait
        return None

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
        return len(self._lot)

    @property
    def available(self) -> int:
        """Free slots now."""
        return self._max_concurrent - self._in_flight

    @property
    def rejected(self) -> int:
        """Calls refused since the bulkhead was built."""
        return self._rejections.value

    def describe(self) -> str:
        o = self.options
        wait = "inf" if o.max_wait in (None, _INF) else f"{o.max_wait:g}s"
        return (
            f"Bulkhead({self.name!r}, max_concurrent={o.max_concurrent}, "
            f"max_queue={o.max_queue}, max_wait={wait})"
        )


class ThreadPoolBulkhead(Flow):
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

    As a flow: one step, :class:`~floodwall._core.offload.Offload`, which submits the call to
    the pool and waits for its answer within the budget (``run`` in the calling thread;
    ``arun``, for ``run_async``, in a task).
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
        self.name = validate.text("name", name)
        self.clock = clock
        self.max_workers = _limit("max_workers", max_workers, 1)
        self.max_queue = _limit("max_queue", max_queue, 0)
        self.timeout = (
            _INF if timeout is None else seconds("timeout", timeout, positive=True, infinite=True)
        )
        self.listeners = Listeners(listeners)
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_workers, thread_name_prefix=f"floodwall-{name}"
        )
        self._lock = threading.Lock()
        self._admitted = 0
        self._closed = False
        self._rejections = Tally()
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
        self._rejections.add()
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

    def expired(self, budget: float, future: Future[Any]) -> TimeoutExceeded:
        """Stop waiting for ``future`` after ``budget`` seconds: cancel it if still queued."""
        future.cancel()  # still queued: it will never run
        self._timeouts += 1
        return TimeoutExceeded(self.name, budget, f"no result from the pool within {budget:.3f}s")

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """Offload the protected call; coroutine functions are refused (use :class:`Bulkhead`)."""
        return (yield Offload(self, self._wait_budget(), refusal=self._refusal()))

    async def run_async(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await ``fn(*args, **kwargs)`` run on the pool (for blocking calls in async code)."""
        job = functools.partial(fn, *args, **kwargs)
        return await Offload(self, self._wait_budget(), job).arun()  # type: ignore[no-any-return]

    def _refusal(self) -> str:
        return (
            f"ThreadPoolBulkhead {self.name!r} runs sync callables on threads; use "
            "`await pool.run_async(blocking_fn, ...)` for those, or a Bulkhead for coroutines"
        )

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking calls, cancel queued ones; with ``wait``, wait for running ones."""
        validate.flag("wait", wait, error=ValueError)
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
        return self._rejections.value

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
        if not isinstance(window, WindowSnapshot):
            raise ConfigError(
                f"window must be a WindowSnapshot (breaker.metrics()), got {window!r}"
            )
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
    validate.number("peak_rps", peak_rps, 0.0)
    validate.seconds("p99_latency", p99_latency)
    _limit("buffer", buffer, 0)
    return max(1, math.ceil(peak_rps * p99_latency - 1e-9) + buffer)
