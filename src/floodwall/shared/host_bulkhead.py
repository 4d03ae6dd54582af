"""A bulkhead (and a concurrency limit) that holds for every process of the host.

A :class:`~floodwall.Bulkhead` of 20 in each of eight gunicorn workers lets 160 calls reach
the dependency it protects. :class:`HostBulkhead` keeps one count for the host: its slots are
a System V semaphore of a ``host://NAME`` store (:mod:`floodwall.stores.host`), taken with
``SEM_UNDO``, so the slots of a worker killed mid-call (``kill -9``, the OOM killer) come back
the moment it dies. With ``max_wait=0`` (the default) it is a host-wide concurrency limit that
refuses at once; with ``max_wait`` > 0 callers wait for a slot, bounded.

As a gate: ``admit`` takes a slot (one ``semop``) or refuses with
:class:`~floodwall.BulkheadFullError`, or raises ``Wait`` whose step sleeps in the kernel
(``semtimedop``) for at most ``max_wait`` (and never past the ambient deadline) in a thread,
and polls every 0.5 to 5 ms in a task (never blocking the event loop); ``record`` gives the
slot back, whatever the outcome.

When the store fails (its objects removed under it, permissions, a size or layout the running
processes do not share; never a slow server: there is none), ``on_store_error`` decides, as
for every store-backed policy: ``"local"`` (default) keeps a :class:`~floodwall.Bulkhead` in
this process of ``max_concurrent ÷ expected_instances``, ``"fail_open"`` admits,
``"fail_closed"`` refuses; the store is tried again a second later. Events ``store_down`` /
``store_up`` tell the listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.drivers import wait_async, wait_sync
from floodwall._core.errors import BulkheadFullError, ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.steps import Step, Wait
from floodwall._core.tally import Tally
from floodwall._core.validate import count
from floodwall.bulkhead import Bulkhead, BulkheadOptions
from floodwall.context import _DEADLINE
from floodwall.stores import resolve
from floodwall.stores.base import Store, StoreUnavailableError
from floodwall.stores.guard import StoreErrorMode, check_mode
from floodwall.stores.host import HostSlots, HostStore

__all__ = ["HostBulkhead"]

_INF = float("inf")
_POLL_MIN, _POLL_MAX = 0.0005, 0.005
_BYPASSED = object()
_NO_CALL: dict[str, Any] = {}


_SEMVMX = 32767
"""The largest value of a SysV semaphore: slots a host bulkhead can count."""


class _Local:
    """The permit of a call admitted by the in-process fallback bulkhead."""

    __slots__ = ()


_LOCAL = _Local()


class _TakeSlot(Step):
    """Wait for a slot: in the kernel (a thread) or by polling (a task), at most ``budget``.
    Its value: True (taken), False (no slot in time) or the store's error."""

    __slots__ = ("budget", "slots")

    def __init__(self, slots: HostSlots, budget: float) -> None:
        self.slots = slots
        self.budget = budget

    def run(self, call: Callable[[], Any]) -> bool | StoreUnavailableError:
        try:
            return self.slots.wait(self.budget)
        except StoreUnavailableError as exc:
            return exc

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> bool | StoreUnavailableError:
        loop = asyncio.get_running_loop()
        end = loop.time() + self.budget
        pause = _POLL_MIN
        try:
            while not self.slots.take():
                left = end - loop.time()
                if left <= 0:
                    return False
                await asyncio.sleep(min(pause, left))
                pause = min(_POLL_MAX, pause * 2)
        except StoreUnavailableError as exc:
            return exc
        return True


class _Attach(Step):
    """Find the host's slots for a bulkhead (the store's lock is taken: a holder that is
    stopped makes it wait up to the store's ``timeout``): in a thread directly, from a task in
    a worker thread, so the event loop never waits for it. Its value: the slots or the store's
    error."""

    __slots__ = ("bulkhead",)

    def __init__(self, bulkhead: HostBulkhead) -> None:
        self.bulkhead = bulkhead

    def run(self, call: Callable[[], Any]) -> HostSlots | StoreUnavailableError:
        try:
            return self.bulkhead._held()
        except StoreUnavailableError as exc:
            return exc

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> HostSlots | StoreUnavailableError:
        return await asyncio.to_thread(self.run, call)


class HostBulkhead(Gate):
    """At most ``max_concurrent`` calls at once across every process of the host
    (see [One host, many workers][guide-host]).

    ``store``: a :class:`~floodwall.stores.host.HostStore` or its ``host://NAME`` URL; every
    process naming the same store and the same ``name`` shares the slots. The first process
    sets ``max_concurrent``; while the slots are in use, one asking for another size is refused
    at construction if this process holds the old size (a reload), else its calls are
    answered by ``on_store_error`` (a worker of a rolling deploy).
    ``max_wait`` (seconds, default 0: refuse at once) and ``max_queue`` (callers of the host
    waiting at once, checked before a caller waits; needed when ``max_wait`` > 0) as for
    :class:`~floodwall.Bulkhead`; ``bypass`` too. Usable as a decorator, with ``call`` /
    ``call_async``, in a pipeline, or with :meth:`acquire` / :meth:`release`.
    """

    kind = "bulkhead"

    def __init__(
        self,
        name: str = "bulkhead",
        *,
        store: HostStore | str,
        max_concurrent: int = defaults.BULKHEAD_MAX_CONCURRENT,
        max_queue: int = defaults.BULKHEAD_MAX_QUEUE,
        max_wait: float = defaults.BULKHEAD_MAX_WAIT,
        bypass: Callable[..., bool] | None = None,
        on_store_error: StoreErrorMode = "local",
        expected_instances: int = 1,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        count("max_concurrent", max_concurrent, 1, _SEMVMX)  # a SysV semaphore's bound
        if max_wait is None:
            raise ConfigError("max_wait must be a number of seconds >= 0, got None")
        self.options = BulkheadOptions(max_concurrent, max_queue, max_wait, bypass)
        """The options (frozen, as :class:`~floodwall.Bulkhead`'s), read once below."""
        resolved: Store = resolve(store)
        if not isinstance(resolved, HostStore):
            raise ConfigError(f"store must be a host:// store, got {resolved.url!r}")
        self.store = resolved
        self._owns_store = isinstance(store, str)
        self.max_concurrent = self.options.max_concurrent
        self.max_queue = self.options.max_queue
        self.max_wait = float(max_wait)
        self.bypass = self.options.bypass
        self.store.check_size(name, self.max_concurrent)  # a reload cannot resize it
        self.on_store_error = check_mode(on_store_error)
        self.expected_instances = count("expected_instances", expected_instances, 1)
        self.clock = clock
        listeners = tuple(listeners)
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._never_waits = self.max_wait == 0
        self._slots: HostSlots | None = None
        self._down_until = -_INF
        self._local = Bulkhead(
            f"{name}.local",
            max_concurrent=max(1, self.max_concurrent // self.expected_instances),
            clock=clock,
            listeners=listeners,
        )
        self._rejections = Tally()
        self._degraded_calls = Tally()

    # -- the gate ---------------------------------------------------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        """Take a slot of the host, or refuse, or raise ``Wait`` to wait for one."""
        if self.bypass is not None and kwargs is not _NO_CALL and self.bypass(*args, **kwargs):
            return _BYPASSED
        slots = self._slots
        if slots is None:
            if now < self._down_until:
                return self._degraded(None)
            raise Wait(_Attach(self))  # the first call: find the slots, off the event loop
        return self._take(slots)

    def _take(self, slots: HostSlots) -> object:
        """Take a slot now, or refuse, or raise ``Wait`` to wait for one."""
        try:
            if slots.take():
                return slots
            if self._never_waits:
                raise self._reject("full", slots)
            if slots.waiting >= self.max_queue:
                raise self._reject("queue full", slots)
        except StoreUnavailableError as exc:
            return self._degraded(exc)
        raise Wait(_TakeSlot(slots, self._budget()))

    def resume(self, step: Step, value: Any, now: float) -> object:
        """After the wait: the slot (a permit), the timed-out refusal, or the store's error;
        after finding the slots, what taking one gives."""
        if isinstance(step, _Attach):
            if isinstance(value, StoreUnavailableError):
                return self._degraded(value)
            self._attached(value)
            return self._take(value)
        assert isinstance(step, _TakeSlot)
        if value is True:
            return step.slots
        if isinstance(value, StoreUnavailableError):
            return self._degraded(value)
        raise self._reject(f"no slot within {step.budget:.3f}s", step.slots)

    def record(
        self,
        permit: Any,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Give the slot back (to the host, or to the in-process fallback that lent it)."""
        if permit.__class__ is HostSlots:
            try:
                permit.give()
            except StoreUnavailableError:
                self._slots = None  # removed under us: the slot went with the semaphore
        elif permit is _LOCAL:
            self._local.release()

    # -- the store and its outages ----------------------------------------------------------

    def _attached(self, slots: HostSlots) -> None:
        """Use ``slots`` from now on (and say so if the store was down)."""
        self._slots = slots
        if self._down_until != -_INF:
            self._down_until = -_INF
            self._emit("store_up", "the host store answers again")

    def _held(self) -> HostSlots:
        """The host's slots; a size or a layout the running processes do not share is a
        store this process cannot use (``on_store_error`` answers), not an error per call."""
        try:
            return self.store.slots(self.name, self.max_concurrent)
        except ConfigError as exc:
            error = StoreUnavailableError(self.store.url, "bulkhead")
            error.__cause__ = exc
            raise error from exc

    def _degraded(self, error: StoreUnavailableError | None) -> object:
        """``on_store_error``'s answer while the host store is unavailable."""
        if error is not None:
            self._slots = None
            first = self._down_until == -_INF
            self._down_until = self._now() + defaults.STORE_BREAKER_OPEN
            if first:
                self._emit("store_down", str(error))
        self._degraded_calls.add()
        mode = self.on_store_error
        if mode == "fail_open":
            return _BYPASSED
        if mode == "fail_closed":
            raise self._reject("the host store is unavailable and on_store_error='fail_closed'")
        self._local.acquire()  # raises the fallback's BulkheadFullError when it is full
        return _LOCAL

    def _emit(self, kind: str, reason: str) -> None:
        if self.listeners:
            self.listeners.emit(Event(kind, "store_guard", self.name, self._now(), reason))

    # -- refusals ---------------------------------------------------------------------------

    def _budget(self) -> float:
        budget = self.max_wait
        outer = _DEADLINE.get()
        if outer is not None:
            budget = min(budget, outer.remaining())
        return max(0.0, budget)

    def _reject(self, reason: str, slots: HostSlots | None = None) -> BulkheadFullError:
        """The refusal with the host's figures (read now: another process may have moved)."""
        in_flight = queued = None
        if slots is not None:
            with contextlib.suppress(StoreUnavailableError):
                in_flight, queued = self.max_concurrent - slots.free, slots.waiting
        error = BulkheadFullError(
            self.name, reason, None, self.max_concurrent, self.max_queue, in_flight, queued
        )
        self._rejections.add()
        if self.listeners:
            self.listeners.emit(
                Event(
                    kind="rejected",
                    source=self.kind,
                    name=self.name,
                    time=self._now(),
                    reason=str(error),
                    figures={
                        "max_concurrent": self.max_concurrent,
                        "max_queue": self.max_queue,
                        "in_flight": in_flight,
                        "queued": queued,
                        "scope": "host",
                    },
                )
            )
        return error

    # -- direct use -------------------------------------------------------------------------

    def acquire(self) -> object:
        """Take a slot (waiting as configured) or raise :class:`BulkheadFullError`; the
        permit to hand to :meth:`release`."""
        try:
            return self.admit(self._now(), (), _NO_CALL)
        except Wait as wait:
            return wait_sync(self, wait)

    async def acquire_async(self) -> object:
        """:meth:`acquire` for coroutines (polls; never blocks the event loop)."""
        try:
            return self.admit(self._now(), (), _NO_CALL)
        except Wait as wait:
            return await wait_async(self, wait)

    def release(self, permit: object) -> None:
        """Give back what :meth:`acquire` took."""
        self.record(permit, self._now(), 0.0, None, None)

    # -- observers --------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Calls holding a slot now, in every process of the host."""
        return self.max_concurrent - self.available

    @property
    def available(self) -> int:
        """Free slots of the host now (the fallback's while the store is down)."""
        try:
            return (self._slots or self._held()).free
        except StoreUnavailableError:
            return self._local.available

    @property
    def queued(self) -> int:
        """Callers of the host waiting for a slot in the kernel now (tasks poll: not counted)."""
        try:
            return (self._slots or self._held()).waiting
        except StoreUnavailableError:
            return 0

    @property
    def rejected(self) -> int:
        """Calls this process refused since the bulkhead was built."""
        return self._rejections.value

    @property
    def store_state(self) -> Literal["up", "down"]:
        """``"down"`` from a failure of the host store until it answers again (meanwhile
        ``on_store_error`` answers), as a :class:`~floodwall.stores.StoreGuard`'s ``state``."""
        return "up" if self._down_until == -_INF else "down"

    @property
    def degraded(self) -> int:
        """Calls of this process ``on_store_error`` answered because the host store did not."""
        return self._degraded_calls.value

    def describe(self) -> str:
        return (
            f"HostBulkhead({self.name!r}, max_concurrent={self.max_concurrent}, "
            f"max_queue={self.max_queue}, max_wait={self.max_wait:g}s, store={self.store.url})"
        )

    def close(self) -> None:
        """Close the store when the bulkhead made it from a URL."""
        if self._owns_store:
            self.store.close()
