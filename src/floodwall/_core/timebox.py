"""A call run within a time bound: the one place that cancels tasks, arms alarms and abandons
threads for :class:`~floodwall.Timeout`.

:class:`Timebox` is the step a timeout hands to the driver. Its ``arun`` cancels the awaited work
at the deadline; its ``run`` does what a thread can (see the ``mode`` list in
:mod:`floodwall.timeout`). The policy keeps the options, the budget arithmetic and the events.

Async cost: no timer handle per call. Calls under one timeout expire in the order they started,
so each call appends an entry to a FIFO and a single watchdog task per event loop sleeps until
the oldest live entry is due (entries that end early are dropped from the head as they finish).
Calls whose inherited deadline is earlier than their own go to a small heap beside the FIFO.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import signal
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from types import FrameType
from typing import Any, Protocol

from floodwall import context as _context
from floodwall._core import validate
from floodwall._core.clock import Clock, SystemClock
from floodwall._core.errors import ConfigError, TimeoutExceeded
from floodwall._core.steps import Scope
from floodwall.context import Deadline

# Assigned, not imported by name: CPython 3.11 calls a method of an import-bound name through
# a bound method made per call (docs/gateway.md, "A fifth pass").
_DEADLINE = _context._DEADLINE

__all__ = ["Boxed", "Timebox", "Watchdogs", "can_signal"]

_PENDING, _DONE, _EXPIRED = 0, 1, 2
_INF = float("inf")


class Boxed(Protocol):
    """What a :class:`Timebox` needs of its policy."""

    name: str
    clock: Clock
    thread_limit: int
    _abandoned: int
    _abandoned_lock: threading.Lock
    _watchdogs: Watchdogs

    @property
    def mode(self) -> str: ...

    @property
    def seconds(self) -> float: ...

    def _now(self) -> float: ...

    def _budget(self, now: float) -> tuple[float, bool]: ...

    def _expired(self, budget: float, inherited: bool) -> TimeoutExceeded: ...

    def _refused(self, budget: float) -> TimeoutExceeded: ...

    def _on_abandoned(self, worker: str, budget: float, count: int) -> None: ...


class Timebox(Scope):
    """Run each call of ``policy`` within its budget: the policy's ``seconds``, or what is left
    of the ambient deadline when that is less (``inherited``)."""

    __slots__ = ("policy",)

    def __init__(self, policy: Boxed) -> None:
        self.policy = policy

    # -- in a task -------------------------------------------------------------------------

    async def arun(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        policy = self.policy
        start = policy._now()
        # the common cases inline (no ambient deadline, or one that ends after this call's
        # own: read once, no _budget or remaining() call; the loop's watch at hand): benchmark
        # group "timeout box, common case"
        budget = policy.seconds
        inherited = False
        outer = _DEADLINE.get()
        if outer is not None:
            # on the policy's own clock, the deadline is compared with this call's start: one
            # clock reading fewer per call (the two ends, outer.at and start + budget, on one read)
            clock = outer.clock
            left = outer.at - (start if clock is policy.clock else clock.monotonic())
            if left < budget:
                budget, inherited = policy._budget(start)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"Timeout {policy.name!r}: call_async must run inside a task")
        # the entry under watch is the call's deadline: benchmark group "timeout box, common
        # case" (built without a class call: _Entry's Python __init__ re-enters the interpreter)
        entry = _new(_Entry)
        entry.at = start + budget
        entry.clock = policy.clock
        entry.task = task
        entry.cancelling = task.cancelling()
        entry.state = _PENDING
        dogs = policy._watchdogs
        loop = task.get_loop()
        if inherited or loop is not dogs._loop:
            watch = dogs.enter(entry, inherited)
        else:
            watch = dogs._watch
            watch.fifo.append(entry)
            if watch.task is None:
                dogs._restart(watch, loop)
        token = _DEADLINE.set(entry)
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError as exc:
            if entry.state == _EXPIRED and task.uncancel() <= entry.cancelling:
                raise policy._expired(budget, inherited) from exc
            raise
        finally:
            _DEADLINE.reset(token)
            if entry.state == _PENDING:
                entry.state = _DONE
            entry.task = None  # a deadline kept by the caller must not keep the task
            fifo = watch.fifo
            while fifo and fifo[0].state:
                fifo.popleft()
        if entry.state == _EXPIRED:
            task.uncancel()  # the work finished although we asked it to stop: keep its answer
        return result

    # -- in a thread -----------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        policy = self.policy
        start = policy._now()
        budget, inherited = policy._budget(start)
        token = _DEADLINE.set(Deadline(start + budget, policy.clock))
        try:
            mode = policy.mode
            if mode == "auto":
                # A fake clock cannot drive a real alarm: under one, time is the clock's.
                real = isinstance(policy.clock, SystemClock)
                mode = "signal" if real and can_signal() else "cooperative"
            if mode == "signal":
                return self._signal(partial(fn, *args, **kwargs), budget, inherited)
            if mode == "thread":
                return self._thread(partial(fn, *args, **kwargs), budget, inherited)
            result = fn(*args, **kwargs)
            if policy.clock.monotonic() - start > budget:
                raise policy._expired(budget, inherited)
            return result
        finally:
            _DEADLINE.reset(token)

    def _signal(self, call: Callable[[], Any], budget: float, inherited: bool) -> Any:
        if not can_signal():
            raise ConfigError(
                f"mode='signal' needs the main thread on POSIX, got thread "
                f"{threading.current_thread().name!r}"
            )
        marker = _Alarm()

        def on_alarm(signum: int, frame: FrameType | None) -> None:
            raise marker

        clock = self.policy.clock
        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
        outer_left, _ = signal.setitimer(signal.ITIMER_REAL, budget)
        started = clock.monotonic()
        try:
            return call()
        except _Alarm as alarm:
            if alarm is not marker:
                raise  # an outer timeout's alarm: let it reach its owner
            raise self.policy._expired(budget, inherited) from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
            if outer_left > 0:
                # Re-arm the enclosing timer with what is left of it (at least 1 µs, so a timer
                # that came due while we ran still fires).
                left = outer_left - (clock.monotonic() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6))

    def _thread(self, call: Callable[[], Any], budget: float, inherited: bool) -> Any:
        policy = self.policy
        lock = policy._abandoned_lock
        with lock:
            if policy._abandoned >= policy.thread_limit:
                raise policy._refused(budget)
        future: Future[Any] = Future()
        context = contextvars.copy_context()
        abandoned = threading.Event()

        def work() -> None:
            try:
                future.set_result(context.run(call))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
            finally:
                if abandoned.is_set():
                    with lock:
                        policy._abandoned -= 1

        name = f"floodwall-timeout-{policy.name}-{next(_thread_ids)}"
        worker = threading.Thread(target=work, name=name, daemon=True)
        worker.start()
        try:
            return future.result(timeout=budget)
        except FutureTimeout:
            with lock:
                if future.done():  # finished in the instant between the wait and the lock
                    return future.result()
                abandoned.set()
                policy._abandoned += 1
                count = policy._abandoned
            policy._on_abandoned(name, budget, count)
            raise policy._expired(budget, inherited) from None


_new = object.__new__


class _Entry(Deadline):
    """One async call under watch, and the deadline it runs under: its task (until it ends)
    and whether it ended or expired."""

    __slots__ = ("cancelling", "state", "task")

    def __init__(self, at: float, clock: Clock, task: asyncio.Task[Any], cancelling: int) -> None:
        self.at = at
        self.clock = clock
        self.task: asyncio.Task[Any] | None = task
        self.cancelling = cancelling
        self.state = _PENDING

    def __lt__(self, other: _Entry) -> bool:
        return self.at < other.at


class _Watch:
    """Per event loop: the FIFO of same-length calls, the heap of shorter ones, the watchdog."""

    __slots__ = ("fifo", "heap", "target", "task")

    def __init__(self) -> None:
        self.fifo: deque[_Entry] = deque()
        self.heap: list[_Entry] = []
        self.task: asyncio.Task[None] | None = None
        self.target = _INF


class Watchdogs:
    """One watchdog per event loop for one timeout policy (see :mod:`floodwall._core.timebox`)."""

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = validate.text("name", name)
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch = _Watch()
        self._watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = (
            weakref.WeakKeyDictionary()
        )

    def enter(self, entry: _Entry, inherited: bool) -> _Watch:
        """Put ``entry`` under watch in the running loop (waking the watchdog if needed)."""
        loop = asyncio.get_running_loop()
        watch = self._watch if loop is self._loop else self._watch_for(loop)
        if inherited:
            heapq.heappush(watch.heap, entry)
            if entry.at < watch.target:
                self._restart(watch, loop)
        else:
            watch.fifo.append(entry)
            if watch.task is None:
                self._restart(watch, loop)
        return watch

    def _watch_for(self, loop: asyncio.AbstractEventLoop) -> _Watch:
        watch = self._watches.get(loop)
        if watch is None:
            watch = self._watches[loop] = _Watch()
        self._loop, self._watch = loop, watch
        return watch

    def _restart(self, watch: _Watch, loop: asyncio.AbstractEventLoop) -> None:
        if watch.task is not None:
            watch.task.cancel()
        watch.task = loop.create_task(self._watchdog(watch), name=f"floodwall-timeout-{self.name}")

    async def _watchdog(self, watch: _Watch) -> None:
        """Cancel every call whose deadline has come; sleep until the next one; exit when idle."""
        me = asyncio.current_task()
        try:
            while True:
                now = self.clock.monotonic()
                nxt = _expire(watch, now)
                if nxt == _INF:
                    return
                watch.target = nxt
                await self.clock.async_sleep(nxt - now)
        finally:
            if watch.task is me:
                watch.task = None
                watch.target = _INF


def _expire(watch: _Watch, now: float) -> float:
    fifo = watch.fifo
    while fifo and (fifo[0].state or fifo[0].at <= now):
        _cancel(fifo.popleft())
    heap = watch.heap
    while heap and (heap[0].state or heap[0].at <= now):
        _cancel(heapq.heappop(heap))
    head = fifo[0].at if fifo else _INF
    return min(head, heap[0].at) if heap else head


def _cancel(entry: _Entry) -> None:
    if entry.state == _PENDING:
        entry.state = _EXPIRED
        assert entry.task is not None  # set until the call ends
        entry.task.cancel()


class _Alarm(BaseException):
    """Raised by the SIGALRM handler; BaseException so ``except Exception`` cannot swallow it."""


_thread_ids = itertools.count(1)


def can_signal() -> bool:
    """Whether a ``SIGALRM`` interval timer can interrupt this thread (main thread, POSIX)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
