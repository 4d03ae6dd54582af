"""Time-slice global limiting: count locally, report per slice, drop locally at one shared rate.

The seeds' "approximate global limit" for limits too hot for a store round trip per request:

1. every instance counts the requests it sees (admitted or not) during a slice of
   ``slice_length`` seconds (default 10 s);
2. at the end of its slice it reports its QPS (count ÷ the slice's length, measured on its own
   monotonic clock) to the store; one instance, elected by a lease in the store (taken when free,
   renewed with every report, lapsing after 3 slices without one), sums the reports of the last
   2 slices into the cluster's QPS and publishes ``drop_rate = max(0, (QPS − limit) / QPS)``;
   the others read it back in the same round trip (``lua/timeslice_sync.lua``, one op);
3. until the next report, each instance refuses each request with probability ``drop_rate``
   (its ``rng``): no store call on the request path, a counter and a random draw.

**Promise** (approximate): with steady traffic, the admitted rate converges to the limit within
two slices (the drop rate uses the offered QPS, so one slice of steady load gives the exact
fraction); it lags changes in traffic by up to a slice, and admits about ``limit`` per second
on average, not per any given second. The elected instance's failure costs at most 3 slices
of stale drop rate (the lease lapses and the published rate expires with it, reading as 0).

Reports and sync: a background thread per limiter reports every slice (started by the first
decision, or by :meth:`TimeSliceLimiter.start`; :meth:`~TimeSliceLimiter.close` stops it); or
drive it yourself with ``background=False`` and :meth:`~TimeSliceLimiter.sync` /
:meth:`~TimeSliceLimiter.sync_async` (tests do, on a :class:`~floodwall.FakeClock`).

When the store is down, reports degrade by ``on_store_error``: ``"local"`` (default) computes the
drop rate from this instance's own QPS against the limit ÷ ``expected_instances``;
``"fail_open"`` sets it to 0; ``"fail_closed"`` to 1 (refuse everything) until the store answers.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import uuid
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, RateLimitedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all
from floodwall._core.pending import settle, settle_async
from floodwall._core.roundtrip import GuardedApply
from floodwall._core.steps import FlowSteps
from floodwall.breaker import CircuitBreaker
from floodwall.ratelimit._base import Decision, RateLike, _new, parse_rate, rate_field
from floodwall.shared.global_limit import _cost
from floodwall.stores import resolve
from floodwall.stores.base import KEEP, Arg, Op, Record, Store, Write
from floodwall.stores.guard import Guarded, StoreErrorMode, StoreGuard, mode_field

__all__ = ["SLICE_SYNC", "SliceReport", "TimeSliceLimiter", "TimeSliceOptions", "TimeSliceSyncOp"]


@dataclass(frozen=True, slots=True)
class TimeSliceOptions:
    """A :class:`TimeSliceLimiter`'s options, validated once: ``rate`` (the cluster's, kept as a
    :class:`~floodwall.ratelimit.Rate`), ``slice_length`` (seconds per slice, >= 1 ms; 10 s),
    ``on_store_error`` (``local``), ``expected_instances`` (1) and ``background`` (sync in a
    thread of its own, on)."""

    rate: RateLike
    slice_length: float = defaults.TIMESLICE_LENGTH
    on_store_error: StoreErrorMode = "local"
    expected_instances: int = 1
    background: bool = True

    CHECKS: ClassVar[Checks] = {
        "rate": rate_field,
        "slice_length": partial(validate.seconds, minimum=0.001),
        "on_store_error": mode_field,
        "expected_instances": validate.count,
        "background": validate.flag,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


SliceReport = tuple[int, bool, int, int]
"""``(drop_ppm, elected, qps_milli, instances)``; ``qps_milli = -1`` when not elected."""


class TimeSliceSyncOp(Op[SliceReport]):
    """``lua/timeslice_sync.lua``: args ``(instance, count, elapsed_us, limit_milli, slice_us,
    stale_slices, lease_slices)`` → :data:`SliceReport`. Records: the reports (JSON here, a hash
    on Redis), the lease, the published drop rate."""

    script = "timeslice_sync"
    suffixes = ("", ":leader", ":drop")

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], SliceReport]:
        t = round(now * 1_000_000)
        me, count, elapsed = str(args[0]), int(args[1]), int(args[2])
        limit, slice_us = int(args[3]) / 1000, int(args[4])
        keep = now + ((int(args[6]) * slice_us) // 1000 + 1) / 1000
        reports: dict[str, list[float]] = {}
        if records[0] is not None:
            reports = json.loads(records[0].value)
        reports[me] = [t, count * 1000000 / elapsed if elapsed > 0 else 0]
        leader = None if records[1] is None else records[1].value.decode()
        lease: Write = KEEP
        if leader is None or leader == me:
            leader, lease = me, Record(me.encode(), keep)
        if leader != me:
            drop = 0 if records[2] is None else int(records[2].value)
            return [Record(json.dumps(reports).encode(), keep), lease, KEEP], (drop, False, -1, 0)
        stale = int(args[5]) * slice_us
        live = {k: v for k, v in reports.items() if t - v[0] <= stale}
        total = sum(v[1] for v in live.values())
        ppm = int((total - limit) / total * 1_000_000 + 0.5) if total > limit else 0
        writes = [
            Record(json.dumps(live).encode(), keep),
            lease,
            Record(str(ppm).encode(), keep),
        ]
        return writes, (ppm, True, round(total * 1000), len(live))

    def parse(self, raw: Any) -> SliceReport:
        ppm, elected, qps, n = raw.split()
        return int(ppm), elected in {b"1", "1"}, int(qps), int(n)


SLICE_SYNC = TimeSliceSyncOp()


def _default_instance() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class TimeSliceLimiter(Gate):
    """``rate`` across every instance sharing the store, enforced by local random drops at a
    rate recomputed once per slice (see [Distributed state][guide-distributed]).

    As a gate: ``admit`` counts the call and drops it at the current drop rate (raising the
    rejection); ``record`` learns nothing. The slice's report is one step generator
    (a guarded store op) that :meth:`sync` and :meth:`sync_async` settle.

    ``instance``: this instance's id in the reports (default host:pid:random). ``rng``: the
    random source of the drops. ``expected_instances``: for the ``"local"`` fallback.
    """

    kind = "rate_limiter"

    def __init__(
        self,
        rate: RateLike,
        *,
        store: Store | str | None = None,
        prefix: str | None = None,
        name: str = "timeslice",
        slice_length: float = defaults.TIMESLICE_LENGTH,
        on_store_error: StoreErrorMode = "local",
        expected_instances: int = 1,
        instance: str | None = None,
        breaker: CircuitBreaker | None = None,
        background: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = TimeSliceOptions(
            rate, slice_length, on_store_error, expected_instances, background
        )
        """The validated :class:`TimeSliceOptions`, read once, here."""
        self.rate = parse_rate(o.rate)
        self.limit = self.rate.count
        self.window = self.rate.period
        if prefix is not None and not isinstance(store, str):
            raise ConfigError(
                "prefix applies when store is a URL; set it on the Store itself otherwise"
            )
        self.name = validate.text("name", name)
        self.slice_length = o.slice_length
        self.expected_instances = o.expected_instances
        self.instance = (
            _default_instance() if instance is None else validate.text("instance", instance)
        )
        self.background = o.background
        self.clock = clock
        self.rng = random.Random() if rng is None else rng
        self.listeners = Listeners(listeners)
        self._owns_store = isinstance(store, str)
        self.store = resolve(store) if prefix is None else resolve(store, prefix=prefix)
        self.guard = StoreGuard(
            self.store,
            on_store_error=o.on_store_error,
            name=name,
            breaker=breaker,
            clock=clock,
            listeners=self.listeners,
        )
        per_second = self.rate.per_second
        self._limit_milli = max(1, round(per_second * 1000))
        self._local_milli = max(1, round(per_second * 1000 / o.expected_instances))
        self._slice_us = max(1, round(self.slice_length * 1_000_000))
        self._key = f"ts:{name}"
        self._lock = threading.Lock()
        self._count = 0
        self._since = clock.monotonic()
        self._drop = 0.0
        self._next_sync = self._since + self.slice_length
        self.elected = False
        """Whether this instance computed the drop rate at its last report."""
        self.qps: float | None = None
        """The cluster's QPS at the last report, when this instance was the elected one."""
        self.instances = 0
        self.syncs = 0
        self.sync_errors = 0
        """Background reports that raised (a bug: the store guard never raises store errors)."""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._now = clock.monotonic

    # -- the request path: a counter and a random draw ------------------------------------------

    def acquire(self, key: Hashable = None, cost: int = 1) -> Decision:
        """Count ``cost`` and admit with probability ``1 - drop_rate``; no store call."""
        if key is not None:
            raise TypeError(
                f"TimeSliceLimiter {self.name!r} has one global count and takes key=None only, "
                f"got key={key!r}"
            )
        c = _cost(cost)
        if self._thread is None and self.background:
            self.start()
        with self._lock:
            self._count += c
            drop = self._drop
            left = self._next_sync - self.clock.monotonic()
        if drop <= 0.0 or self.rng.random() >= drop:
            remaining = self.limit if drop <= 0.0 else 0
            return _new(Decision, (True, remaining, max(0.0, left), 0.0, self.limit))
        retry = max(0.0, left) if drop >= 1.0 else self.rate.interval
        return _new(Decision, (False, 0, max(0.0, left), retry, self.limit))

    async def acquire_async(self, key: Hashable = None, cost: int = 1) -> Decision:
        """:meth:`acquire` (it never waits; here for the async shells' symmetry)."""
        return self.acquire(key, cost)

    def try_acquire(self, key: Hashable = None, cost: int = 1) -> bool:
        """Whether the request was admitted."""
        return self.acquire(key, cost)[0]

    # -- the gate ---------------------------------------------------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Count the call and admit it, or raise :class:`~floodwall.RateLimitedError` at the
        drop rate (never a store call, never a ``Wait``)."""
        result = self.acquire()
        if not result[0]:
            raise self._error(result)

    def _error(self, result: Decision) -> RateLimitedError:
        reason = f"{self.describe()}: dropped at drop_rate={self._drop:.3f}"
        if self.listeners:
            self.listeners.emit(
                Event(
                    kind="rejected",
                    source=self.kind,
                    name=self.name,
                    time=self.clock.monotonic(),
                    reason=reason,
                    figures={"drop_rate": self._drop, "limit": self.limit},
                )
            )
        return RateLimitedError(self.name, reason, result[3])

    # -- the report, once per slice ---------------------------------------------------------------

    def _report(self) -> tuple[float, list[Arg], list[Arg] | None]:
        now = self.clock.monotonic()
        with self._lock:
            count, self._count = self._count, 0
            elapsed = max(1, round((now - self._since) * 1_000_000))
            self._since = now
        tail: list[Arg] = [
            self._slice_us,
            defaults.TIMESLICE_STALE_SLICES,
            defaults.TIMESLICE_LEASE_SLICES,
        ]
        args: list[Arg] = [self.instance, count, elapsed, self._limit_milli, *tail]
        local: list[Arg] | None = None
        if self.guard.mode == "local":
            local = [self.instance, count, elapsed, self._local_milli, *tail]
        return now, args, local

    def _apply(self, now: float, guarded: Guarded[SliceReport]) -> float:
        down = guarded.down
        report = guarded.value
        if down is not None and down.mode != "local":
            report = (0 if down.mode == "fail_open" else 1_000_000, False, -1, 0)
        assert report is not None
        ppm, elected, qps_milli, instances = report
        drop = ppm / 1_000_000
        with self._lock:
            before, self._drop = self._drop, drop
            self._next_sync = now + self.slice_length
        self.elected = elected
        self.qps = qps_milli / 1000 if elected else None
        self.instances = instances
        self.syncs += 1
        if self.listeners and drop != before:
            self.listeners.emit(
                Event(
                    kind="drop_rate",
                    source=self.kind,
                    name=self.name,
                    time=now,
                    reason=f"drop rate {before:.3f} -> {drop:.3f}",
                    figures={
                        "drop_rate": drop,
                        "qps": self.qps,
                        "elected": elected,
                        "instances": instances,
                        "store": self.guard.state,
                    },
                )
            )
        return drop

    def _sync_steps(self) -> FlowSteps:
        now, args, local = self._report()
        return self._apply(
            now, (yield GuardedApply(self.guard, SLICE_SYNC, self._key, args, local))
        )

    def sync(self) -> float:
        """Report this slice's count, get the drop rate for the next one (one round trip);
        never raises a store error. Returns the new drop rate."""
        return settle(self._sync_steps())  # type: ignore[no-any-return]

    async def sync_async(self) -> float:
        """:meth:`sync` for async callers."""
        return await settle_async(self._sync_steps())  # type: ignore[no-any-return]

    @property
    def drop_rate(self) -> float:
        """The share of requests this instance refuses until its next report."""
        return self._drop

    # -- the background reporter --------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread that reports every slice (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"floodwall-timeslice-{self.name}", daemon=True
            )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.slice_length):
            try:
                self.sync()
            except Exception:  # noqa: BLE001 - a reporter that died would freeze the drop rate
                self.sync_errors += 1

    def close(self) -> None:
        """Stop the background reporter; close the store when the limiter made it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=4 * defaults.STORE_TIMEOUT + 1.0)
        if self._owns_store:
            self.store.close()

    # -- observers -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Figures for metrics: ``drop_rate``, ``elected``, ``qps`` (when elected),
        ``instances``, ``syncs``, and the store guard's counters."""
        return {
            "drop_rate": self._drop,
            "elected": self.elected,
            "qps": self.qps,
            "instances": self.instances,
            "syncs": self.syncs,
            **self.guard.snapshot(),
        }

    def describe(self) -> str:
        return (
            f"TimeSliceLimiter({self.name!r}, {self.rate}, slice={self.slice_length:g}s, "
            f"store={self.store.url}, on_store_error={self.guard.mode})"
        )
