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

import asyncio
import contextvars
import heapq
import itertools
import signal
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from types import FrameType
from typing import Literal, ParamSpec, TypeVar

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock, SystemClock
from floodwall._core.errors import ConfigError, TimeoutExceeded
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.policy import Policy
from floodwall.context import _DEADLINE, Deadline

__all__ = ["Timeout"]

P = ParamSpec("P")
R = TypeVar("R")
SyncMode = Literal["auto", "signal", "thread", "cooperative"]

_PENDING, _DONE, _EXPIRED = 0, 1, 2
_INF = float("inf")


class _CurrentTasks(Mapping[asyncio.AbstractEventLoop, "asyncio.Task[object]"]):
    """Fallback for interpreters without ``asyncio.tasks._current_tasks``."""

    def __iter__(self) -> Iterator[asyncio.AbstractEventLoop]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __getitem__(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[object]:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("floodwall.Timeout.call_async must run inside a task")
        return task


# asyncio.current_task() is a Python function that looks the loop up again; these are the two C
# lookups it is made of (asyncio.tasks._current_tasks exists since 3.7; checked at import).
_running_loop = asyncio.get_running_loop
_TASKS = getattr(asyncio.tasks, "_current_tasks", None)
_current_tasks: Mapping[asyncio.AbstractEventLoop, asyncio.Task[object]] = (
    _TASKS if isinstance(_TASKS, dict) else _CurrentTasks()
)


class _Entry:
    """One async call under watch: its deadline, task, and whether it ended or expired."""

    __slots__ = ("at", "cancelling", "state", "task")

    def __init__(self, at: float, task: asyncio.Task[object], cancelling: int) -> None:
        self.at = at
        self.task = task
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


class Timeout(Policy):
    """Bound a call to ``seconds`` (and to the ambient deadline); see
    [Timeouts and deadlines][guide-timeouts]."""

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
        if not 0 < seconds < _INF:
            raise ConfigError(f"seconds must be a finite number > 0, got {seconds!r}")
        if mode not in ("auto", "signal", "thread", "cooperative"):
            raise ConfigError(
                f"mode must be one of 'auto', 'signal', 'thread', 'cooperative', got {mode!r}"
            )
        if not isinstance(thread_limit, int) or thread_limit < 1:
            raise ConfigError(f"thread_limit must be an integer >= 1, got {thread_limit!r}")
        self.seconds = float(seconds)
        self.name = name
        self.mode: SyncMode = mode
        self.thread_limit = thread_limit
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch = _Watch()
        self._watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = (
            weakref.WeakKeyDictionary()
        )
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

    # -- async ------------------------------------------------------------------------------

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        start = self._now()
        budget, inherited = self._budget(start)
        loop = _running_loop()
        task: asyncio.Task[object] = _current_tasks[loop]
        watch = self._watch if loop is self._loop else self._watch_for(loop)
        entry = _Entry(start + budget, task, task.cancelling())
        if inherited:
            heapq.heappush(watch.heap, entry)
            if entry.at < watch.target:
                self._restart_watchdog(watch, loop)
        else:
            watch.fifo.append(entry)
            if watch.task is None:
                self._restart_watchdog(watch, loop)
        token = _DEADLINE.set(Deadline(entry.at, self.clock))
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError as exc:
            if entry.state == _EXPIRED and task.uncancel() <= entry.cancelling:
                raise self._expired(budget, inherited) from exc
            raise
        finally:
            _DEADLINE.reset(token)
            if entry.state == _PENDING:
                entry.state = _DONE
            fifo = watch.fifo
            while fifo and fifo[0].state:
                fifo.popleft()
        if entry.state == _EXPIRED:
            task.uncancel()  # the work finished although we asked it to stop: keep its answer
        return result

    def _watch_for(self, loop: asyncio.AbstractEventLoop) -> _Watch:
        watch = self._watches.get(loop)
        if watch is None:
            watch = self._watches[loop] = _Watch()
        self._loop, self._watch = loop, watch
        return watch

    def _restart_watchdog(self, watch: _Watch, loop: asyncio.AbstractEventLoop) -> None:
        if watch.task is not None:
            watch.task.cancel()
        watch.task = loop.create_task(self._watchdog(watch), name=f"floodwall-timeout-{self.name}")

    async def _watchdog(self, watch: _Watch) -> None:
        """Cancel every call whose deadline has come; sleep until the next one; exit when idle."""
        me = asyncio.current_task()
        try:
            while True:
                now = self._now()
                nxt = self._expire(watch, now)
                if nxt == _INF:
                    return
                watch.target = nxt
                await self.clock.async_sleep(nxt - now)
        finally:
            if watch.task is me:
                watch.task = None
                watch.target = _INF

    @staticmethod
    def _expire(watch: _Watch, now: float) -> float:
        fifo = watch.fifo
        while fifo and (fifo[0].state or fifo[0].at <= now):
            _cancel(fifo.popleft())
        heap = watch.heap
        while heap and (heap[0].state or heap[0].at <= now):
            _cancel(heapq.heappop(heap))
        head = fifo[0].at if fifo else _INF
        return min(head, heap[0].at) if heap else head

    # -- sync -------------------------------------------------------------------------------

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        start = self._now()
        budget, inherited = self._budget(start)
        token = _DEADLINE.set(Deadline(start + budget, self.clock))
        try:
            mode = self.mode
            if mode == "auto":
                # A fake clock cannot drive a real alarm: under one, time is the clock's.
                real = isinstance(self.clock, SystemClock)
                mode = "signal" if real and _can_signal() else "cooperative"
            if mode == "signal":
                return self._call_signal(budget, inherited, fn, *args, **kwargs)
            if mode == "thread":
                return self._call_thread(budget, inherited, fn, *args, **kwargs)
            result = fn(*args, **kwargs)
            if self._now() - start > budget:
                raise self._expired(budget, inherited)
            return result
        finally:
            _DEADLINE.reset(token)

    def _call_signal(
        self, budget: float, inherited: bool, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        if not _can_signal():
            raise ConfigError(
                f"mode='signal' needs the main thread on POSIX, got thread "
                f"{threading.current_thread().name!r}"
            )
        marker = _Alarm()

        def on_alarm(signum: int, frame: FrameType | None) -> None:
            raise marker

        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
        outer_left, _ = signal.setitimer(signal.ITIMER_REAL, budget)
        started = self._now()
        try:
            return fn(*args, **kwargs)
        except _Alarm as alarm:
            if alarm is not marker:
                raise  # an outer timeout's alarm: let it reach its owner
            raise self._expired(budget, inherited) from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
            if outer_left > 0:
                # Re-arm the enclosing timer with what is left of it (at least 1 µs, so a timer
                # that came due while we ran still fires).
                left = outer_left - (self._now() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6))

    def _call_thread(
        self, budget: float, inherited: bool, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        with self._abandoned_lock:
            if self._abandoned >= self.thread_limit:
                self._timeouts += 1
                raise TimeoutExceeded(
                    self.name,
                    budget,
                    f"{self._abandoned} timed-out calls are still running "
                    f"(thread_limit={self.thread_limit}); refusing to start another",
                )
        future: Future[R] = Future()
        context = contextvars.copy_context()
        abandoned = threading.Event()

        def work() -> None:
            try:
                future.set_result(context.run(fn, *args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
            finally:
                if abandoned.is_set():
                    with self._abandoned_lock:
                        self._abandoned -= 1

        worker = threading.Thread(
            target=work, name=f"floodwall-timeout-{self.name}-{next(_thread_ids)}", daemon=True
        )
        worker.start()
        try:
            return future.result(timeout=budget)
        except FutureTimeout:
            with self._abandoned_lock:
                if future.done():  # finished in the instant between the wait and the lock
                    return future.result()
                abandoned.set()
                self._abandoned += 1
                count = self._abandoned
            if self.listeners:
                self.listeners.emit(
                    Event(
                        "thread_abandoned",
                        self.kind,
                        self.name,
                        self._now(),
                        f"worker {worker.name} still running after {budget:.3f}s",
                        figures={"abandoned": count, "thread_limit": self.thread_limit},
                    )
                )
            raise self._expired(budget, inherited) from None

    @property
    def abandoned(self) -> int:
        """Worker threads of ``mode="thread"`` calls that timed out and are still running."""
        return self._abandoned

    def describe(self) -> str:
        return f"Timeout({self.seconds:g}s)"


class _Alarm(BaseException):
    """Raised by the SIGALRM handler; BaseException so ``except Exception`` cannot swallow it."""


_thread_ids = itertools.count(1)


def _cancel(entry: _Entry) -> None:
    if entry.state == _PENDING:
        entry.state = _EXPIRED
        entry.task.cancel()


def _can_signal() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
