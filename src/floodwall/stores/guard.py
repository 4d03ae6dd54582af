"""What a policy does when its store is down: a breaker, a fallback, and the way back.

:class:`StoreGuard` wraps any :class:`~floodwall.stores.Store` for one policy. Every op goes
through a :class:`~floodwall.CircuitBreaker` that counts only
:class:`~floodwall.stores.StoreUnavailableError` (not
:class:`~floodwall.stores.StoreRecordTooLargeError`: one record the store cannot hold fails
that op, answered as below, and says nothing about the store). While the store answers, the
guard returns its result. When it does not, the guard returns a :class:`StoreDown` instead of
raising, and the policy applies its ``on_store_error`` mode:

* ``"fail_open"``: act as if the store had said yes (a limiter admits, idempotency runs the
  call unprotected);
* ``"fail_closed"``: act as if it had said no (a limiter rejects with its typed error,
  idempotency rejects with ``IdempotencyUnavailableError``);
* ``"local"``: the guard runs the same op on an in-process :class:`~floodwall.stores.MemoryStore`
  (with ``local_args``: a limiter passes its limit ÷ expected instances), so each process keeps
  its share of the limit until the store is back.

Cost of an outage: the failing calls before the breaker opens (``STORE_BREAKER_ERRORS`` = 3
within ``STORE_BREAKER_WINDOW`` = 10 s) each wait at most the store's ``timeout``; a call that
*timed out* (:class:`~floodwall.stores.StoreTimeoutError`: a frozen server) opens it at once,
since every caller behind it would wait as long. Once open, calls do not touch the network at
all (``short_circuits``). After ``STORE_BREAKER_OPEN`` = 1 s
one probe tries the store; success closes the breaker and the guard is back, with no operator
action; failure doubles the open time, up to ``STORE_BREAKER_MAX_OPEN`` = 10 s, which bounds how
long a recovered store can go unnoticed.

Events (``source="store_guard"``) and counters each way: ``"store_down"`` on the first failure
after a healthy period (``outages`` += 1) and ``"store_up"`` on the first success of a call made
after it (``recoveries`` += 1, ``figures["down_for"]`` in seconds). A call already running when
the store failed says nothing about its recovery: PostgreSQL ends its backends one by one on
shutdown, so such a straggler can succeed between two failures, and would split one outage in
two. ``failures``, ``short_circuits`` and
``degraded`` count calls; ``failed_callers`` counts the callers those failed calls answered (a
batched call carries many: ``callers=``), with those that gave up waiting behind a stuck call
(:meth:`StoreGuard.gave_up_async`). An exception that is not a store error (a bug in an op)
propagates.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, NamedTuple, get_args

from floodwall._core import defaults, validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.drivers import drive_async, drive_sync
from floodwall._core.errors import CircuitOpenError, ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.pending import settle_async
from floodwall._core.steps import CALL, Apply, Step
from floodwall.breaker import CircuitBreaker
from floodwall.stores.base import (
    Arg,
    Op,
    R,
    Store,
    StoreRecordTooLargeError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from floodwall.stores.memory import MemoryStore

__all__ = ["StoreDown", "StoreErrorMode", "StoreGuard", "check_mode"]

StoreErrorMode = Literal["fail_open", "fail_closed", "local"]
_MODES: tuple[str, ...] = get_args(StoreErrorMode)


def check_mode(mode: str, name: str = "on_store_error") -> StoreErrorMode:
    """Validate an ``on_store_error`` value."""
    if mode not in _MODES:
        raise ConfigError(f"{name} must be one of {', '.join(_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


def mode_field(name: str, value: Any) -> StoreErrorMode:
    """An options object's ``on_store_error`` (the ``Check`` form of :func:`check_mode`)."""
    return check_mode(value, name)


@dataclass(frozen=True, slots=True)
class StoreDown:
    """The store did not answer: the guard's ``mode`` and the ``error`` (a
    :class:`StoreUnavailableError`, or the breaker's ``CircuitOpenError`` when the call was
    short-circuited)."""

    mode: StoreErrorMode
    error: BaseException


class Guarded(NamedTuple, Generic[R]):
    """What :meth:`StoreGuard.apply` returns: the op's ``value`` (from the store, or from the
    local store in ``"local"`` mode; ``None`` when the store was down in the other modes) and
    ``down`` (``None`` while the store answers). A tuple: built in C on every decision."""

    value: R | None
    down: StoreDown | None


_new = tuple.__new__
"""``_new(Guarded, (value, down))`` skips the Python-level ``NamedTuple.__new__``."""


def default_breaker(name: str, clock: Clock) -> CircuitBreaker:
    """The breaker a guard uses unless given one (figures:
    [Distributed state][guide-distributed])."""
    return CircuitBreaker(
        name,
        failure_rate=None,
        error_count=defaults.STORE_BREAKER_ERRORS,
        minimum_calls=defaults.STORE_BREAKER_ERRORS,
        window=defaults.STORE_BREAKER_WINDOW,
        open_duration=defaults.STORE_BREAKER_OPEN,
        open_duration_growth=defaults.STORE_BREAKER_OPEN_GROWTH,
        max_open_duration=defaults.STORE_BREAKER_MAX_OPEN,
        record=StoreUnavailableError,
        ignore=StoreRecordTooLargeError,  # one record the store cannot hold: not an outage
        clock=clock,
    )


class StoreGuard:
    """A store behind a breaker, with ``on_store_error`` semantics (see
    [Distributed state][guide-distributed]).

    One step generator (:meth:`_apply`) decides every op; :meth:`apply` and
    :meth:`apply_async` are the two drivers' shells around it.
    """

    in_process: MemoryStore | None
    """The store when it is a plain ``memory://``, which cannot be down, behind the guard's own
    breaker: while that breaker's lane is open (nobody forced it open), :meth:`apply` calls it
    directly, and so may a caller on its hot path (``Frequency.allow``): about 3 µs of a 9 µs
    ``Frequency.allow`` on it (``benchmarks/million_keys.py``). Kept in step with :attr:`store`
    by its setter."""

    def __init__(
        self,
        store: Store,
        *,
        on_store_error: StoreErrorMode = "fail_open",
        name: str = "store",
        breaker: CircuitBreaker | None = None,
        local: Store | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Listeners | Iterable[EventListener] = (),
    ) -> None:
        self._own_breaker = breaker is None
        self.store = validate.instance("store", store, Store, "a Store")
        self.mode = check_mode(on_store_error)
        self.name = validate.text("name", name)
        self.clock = clock
        if breaker is not None:
            validate.instance("breaker", breaker, CircuitBreaker, "a CircuitBreaker or None")
        if local is not None:
            validate.instance("local", local, Store, "a Store or None")
        self.breaker = breaker if breaker is not None else default_breaker(f"{name}.store", clock)
        self.local: Store = (
            local if local is not None else MemoryStore(prefix=store.prefix, clock=clock)
        )
        self.listeners = listeners if isinstance(listeners, Listeners) else Listeners(listeners)
        """Shared with the policy when it passes its own :class:`Listeners`."""
        self.failures = 0
        self.failed_callers = 0
        self.short_circuits = 0
        self.degraded = 0
        self.outages = 0
        self.recoveries = 0
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._degraded_at_down = 0

    @property
    def state(self) -> Literal["up", "down"]:
        """``"down"`` from the first failure until the first success after it."""
        return "up" if self._down_since is None else "down"

    # -- the decision core --------------------------------------------------------------------

    def _short_circuited(self, exc: CircuitOpenError) -> StoreDown:
        self.short_circuits += 1
        return StoreDown(self.mode, exc)

    def _failed(self, exc: StoreUnavailableError, callers: int) -> StoreDown:
        self.failures += 1
        self.failed_callers += callers
        if isinstance(exc, StoreTimeoutError):
            self.breaker.trip(f"a store call timed out, failing {callers} caller(s): {exc}")
        if self._down_since is None and not isinstance(exc, StoreRecordTooLargeError):
            self._mark_down(self.clock.monotonic(), exc, callers)
        return StoreDown(self.mode, exc)

    def _fallback(self) -> bool:
        """Count a degraded call; True when the local store should answer it."""
        self.degraded += 1
        return self.mode == "local"

    def _mark_down(self, now: float, exc: StoreUnavailableError, callers: int) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = now
            self._degraded_at_down = self.degraded
            self.outages += 1
        self._emit("store_down", now, str(exc), {"op": exc.op, "callers": callers})

    def _mark_up(self, now: float) -> None:
        with self._lock:
            since = self._down_since
            if since is None:
                return
            self._down_since = None
            self.recoveries += 1
        figures = {"down_for": now - since, "degraded": self.degraded - self._degraded_at_down}
        self._emit("store_up", now, f"store answered again after {now - since:.3f}s", figures)

    def _emit(self, kind: str, now: float, reason: str, figures: dict[str, Any]) -> None:
        if self.listeners:
            figures = {"store": self.store.url, "mode": self.mode, **figures}
            event = Event(kind, "store_guard", self.name, now, reason, figures=figures)
            self.listeners.emit(event)

    # -- the flow and its two shells ----------------------------------------------------------

    # One generator decides every op (the store's answer, or the degraded one); the drivers run
    # it, the call being the breaker's own shell around the store's sync or async adapter. The
    # breaker's success path takes no lock and reads the clock twice: the guard adds almost
    # nothing while the store answers, and an open breaker refuses in a few hundred nanoseconds.

    def _apply(
        self,
        op: Op[R],
        key: str,
        args: Sequence[Arg],
        local_args: Sequence[Arg] | None,
        callers: int,
    ) -> Generator[Step, Any, Guarded[R]]:
        was_down = self._down_since is not None
        try:
            value = yield CALL
        except CircuitOpenError as exc:
            down = self._short_circuited(exc)
        except StoreUnavailableError as exc:
            down = self._failed(exc, callers)
        else:
            if was_down and self._down_since is not None:
                self._mark_up(self.clock.monotonic())
            return _new(Guarded, (value, None))
        return (yield from self._degrade(down, op, key, args, local_args))

    def _degrade(
        self,
        down: StoreDown,
        op: Op[R],
        key: str,
        args: Sequence[Arg],
        local_args: Sequence[Arg] | None,
    ) -> Generator[Step, Any, Guarded[R]]:
        if self._fallback():
            local = yield Apply(self.local, op, key, args if local_args is None else local_args)
            return _new(Guarded, (local, down))
        return _new(Guarded, (None, down))

    @property
    def store(self) -> Store:
        """The guarded store; assigning another one also re-derives :attr:`in_process`."""
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = store
        self.in_process = store if store.__class__ is MemoryStore and self._own_breaker else None

    def apply(
        self,
        op: Op[R],
        key: str,
        args: Sequence[Arg] = (),
        local_args: Sequence[Arg] | None = None,
        callers: int = 1,
    ) -> Guarded[R]:
        """Run ``op`` on the store; when it is down, degrade (never raises a store error).
        ``callers``: how many callers the op answers (a batch), for ``failed_callers``."""
        store = self.in_process
        if store is not None and self.breaker.lane is not None:
            return _new(Guarded, (store.apply(op, key, args), None))
        steps = self._apply(op, key, args, local_args, callers)
        return drive_sync(steps, partial(self.breaker.call, self.store.apply, op, key, args))  # type: ignore[no-any-return]

    async def apply_async(
        self,
        op: Op[R],
        key: str,
        args: Sequence[Arg] = (),
        local_args: Sequence[Arg] | None = None,
        callers: int = 1,
    ) -> Guarded[R]:
        """:meth:`apply` for async callers."""
        steps = self._apply(op, key, args, local_args, callers)
        call = partial(self.breaker.call_async, self.store.apply_async, op, key, args)
        return await drive_async(steps, call)  # type: ignore[no-any-return]

    async def gave_up_async(
        self,
        op: Op[R],
        key: str,
        args: Sequence[Arg] = (),
        local_args: Sequence[Arg] | None = None,
        callers: int = 1,
    ) -> Guarded[R]:
        """The degraded answer for callers that waited the store's whole ``timeout`` behind a
        call still in flight (a batch on a frozen server): counted in ``failed_callers``; the
        call in flight, when it times out, is what opens the breaker."""
        try:
            raise TimeoutError(f"waited {self.store.timeout}s behind a store call in flight")
        except TimeoutError as cause:
            error = StoreTimeoutError(self.store.url, op.script)
            error.__cause__ = cause
        self.failed_callers += callers
        steps = self._degrade(StoreDown(self.mode, error), op, key, args, local_args)
        return await settle_async(steps)  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        """The guard's counters and state, for metrics."""
        return {
            "state": self.state,
            "breaker": self.breaker.state.name,
            "failures": self.failures,
            "failed_callers": self.failed_callers,
            "short_circuits": self.short_circuits,
            "degraded": self.degraded,
            "outages": self.outages,
            "recoveries": self.recoveries,
        }

    def add_listener(self, listener: EventListener) -> None:
        self.listeners.add(listener)

    def __repr__(self) -> str:
        return f"StoreGuard({self.name!r}, {self.store!r}, on_store_error={self.mode!r})"
