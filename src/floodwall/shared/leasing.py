"""Token leasing: take a small batch of permits from a global limit, spend them locally.

``LeasedLimiter("gcra", "5000/s", store="redis://…", expected_instances=4)`` asks the store for
up to ``lease`` permits at a time (one round trip, the same ops as
:class:`~floodwall.shared.GlobalLimiter`, which grant ``min(lease, available)``) and admits
the next requests from that local pool, with no network at all, until it is spent or
``lease_ttl`` seconds old (unused permits are then dropped, never returned). At ``lease`` permits
per round trip, a busy process makes ``lease`` times fewer round trips.

**Bounds.** Leased permits are taken from the global limit when leased and spent up to
``lease_ttl`` later, so, with ``n`` processes sharing the limit and ``bound(t)`` the algorithm's
own bound over ``t`` seconds (GCRA and token bucket: ``capacity + rate × t``):

* over-admission: in any interval of ``t`` seconds the fleet admits at most
  ``bound(t) + n × (lease - 1)`` (at most ``lease - 1`` unspent permits per process and key when
  the interval starts), and at most ``bound(t + lease_ttl)``;
* under-admission: permits leased and not spent within ``lease_ttl`` are lost, at most
  ``n × (lease - 1)`` per ``lease_ttl``.

The default ``lease`` is ``limit ÷ (10 × expected_instances)``, at most 100, so the fleet's
unspent leases, hence its over-admission, stay within 10 % of the limit. A refusal is cached
until its ``retry_after`` for requests of that cost or more (no round trip per refused request
while the limit is exhausted).

Lease requests do not pile up: async callers make one per key at a time (the others await it,
then spend from the refilled pool), threads one per limiter at a time (a thread that finds the
pool empty waits for the lease in flight, then re-checks the pool). A request costing more than
what is left in the pool leases the difference. When the store is down, ``on_store_error``
applies to each lease request (``"local"``: leases come from this process's share).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import LimitStoreUnavailableError, RateLimitedError
from floodwall._core.events import EventListener
from floodwall._core.flight import LANDED, Flight, Flights
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.pending import advance, start
from floodwall._core.roundtrip import Then
from floodwall._core.steps import FlowSteps, Step
from floodwall.breaker import CircuitBreaker
from floodwall.ratelimit._base import (
    INF,
    Decision,
    Rate,
    RateLike,
    StoreDownDecision,
    _new,
    rate_field,
)
from floodwall.shared._global_ops import Verdict, decision, plan
from floodwall.shared.global_limit import GlobalLimiter, _Acquiring, _cost, algorithm_field
from floodwall.stores.base import Store
from floodwall.stores.guard import StoreErrorMode, StoreGuard, mode_field

__all__ = ["LeaseOptions", "LeasedLimiter"]


@dataclass(frozen=True, slots=True)
class LeaseOptions:
    """A :class:`LeasedLimiter`'s options, validated once: the shared limit's ``algorithm``,
    ``rate``, ``burst``, ``on_store_error`` and ``expected_instances`` (as
    :class:`~floodwall.shared.GlobalLimitOptions`), ``lease`` (permits per lease, >= 1;
    ``None``: ``limit ÷ (10 × expected_instances)``, between 1 and 100) and ``lease_ttl``
    (seconds leased permits stay usable, > 0; 1 s)."""

    algorithm: str
    rate: RateLike
    burst: int | None = None
    lease: int | None = None
    lease_ttl: float = defaults.LEASE_TTL
    on_store_error: StoreErrorMode = "local"
    expected_instances: int = 1

    CHECKS: ClassVar[Checks] = {
        "algorithm": algorithm_field,
        "rate": rate_field,
        "burst": optional(partial(validate.count, minimum=0)),
        "lease": optional(validate.count),
        "lease_ttl": partial(validate.seconds, positive=True),
        "on_store_error": mode_field,
        "expected_instances": validate.count,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        assert isinstance(self.rate, Rate)  # normalised by its check
        plan(self.algorithm, self.rate, self.burst, None)  # the shared limit's rules


_SWEEP_EVERY = 1024
"""Decisions between sweeps of expired pools (amortised O(1))."""


class _Pool:
    """One key's leased permits: ``permits`` usable until ``expires``; refusals cached until
    ``refused_until``; the store's figures at the last lease (``remaining``, ``reset_at``)."""

    __slots__ = ("expires", "permits", "refused_cost", "refused_until", "remaining", "reset_at")

    def __init__(self) -> None:
        self.permits = 0
        self.expires = -INF
        self.refused_until = -INF
        self.refused_cost = 0
        self.remaining = 0
        self.reset_at = -INF


class LeasedLimiter(_Acquiring, Gate):
    """A :class:`~floodwall.shared.GlobalLimiter` whose permits are leased in batches and
    spent locally (see [Distributed state][guide-distributed]). Options are the global limiter's,
    plus ``lease``
    (permits per lease) and ``lease_ttl`` (seconds a lease stays usable).

    As a gate: ``admit`` spends from the pool, or raises ``Wait`` for a
    :class:`~floodwall._core.flight.Flight` that leases (or waits for the lease in flight);
    ``resume`` folds the lease in, admits or raises the rejection. ``record`` learns nothing.
    ``acquire`` spends from the local pool when it has them, else leases (one round trip; one
    thread, or one task per key, at a time).
    """

    kind = "rate_limiter"

    def __init__(
        self,
        algorithm: str,
        rate: RateLike,
        *,
        burst: int | None = None,
        store: Store | str | None = None,
        prefix: str | None = None,
        name: str = "leased",
        key: Callable[..., Hashable] | None = None,
        lease: int | None = None,
        lease_ttl: float = defaults.LEASE_TTL,
        on_store_error: StoreErrorMode = "local",
        expected_instances: int = 1,
        breaker: CircuitBreaker | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = LeaseOptions(
            algorithm, rate, burst, lease, lease_ttl, on_store_error, expected_instances
        )
        """The validated :class:`LeaseOptions`, read once, here."""
        self.source = GlobalLimiter(
            o.algorithm,
            o.rate,
            burst=o.burst,
            store=store,
            prefix=prefix,
            name=name,
            on_store_error=o.on_store_error,
            expected_instances=o.expected_instances,
            breaker=breaker,
            clock=clock,
            listeners=listeners,
        )
        """The global limiter leases come from (its ``guard`` has the store's state)."""
        self.name = validate.text("name", name)
        self.key = key
        self.limit = self.source.limit
        self.window = self.source.window
        self.listeners = self.source.listeners
        self.clock = clock
        if o.lease is None:
            share = defaults.LEASE_SHARE * o.expected_instances
            self.lease = max(1, min(defaults.LEASE_MAX, self.limit // share))
        else:
            self.lease = o.lease
        self.lease_ttl = o.lease_ttl
        self.leases = 0
        """Lease requests sent to the store (round trips)."""
        self.local_decisions = 0
        """Requests answered from a local pool (no round trip)."""
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()
        self._flights = Flights()
        self._now = clock.monotonic
        self._decisions = 0

    # -- the decision core (lock held, no I/O) ----------------------------------------------

    def _local(self, full: str, cost: int, now: float) -> Decision | None:
        """Admit from ``full``'s pool, or refuse from its cached refusal; ``None``: lease."""
        self._decisions += 1
        if self._decisions % _SWEEP_EVERY == 0:
            self._sweep(now)
        pool = self._pools.get(full)
        if pool is None:
            return None
        if pool.expires <= now:
            pool.permits = 0
        if pool.permits >= cost:
            pool.permits -= cost
            self.local_decisions += 1
            return self._granted(pool, now)
        if pool.refused_until > now and cost >= pool.refused_cost:
            self.local_decisions += 1
            wait = pool.refused_until - now
            return _new(Decision, (False, 0, max(0.0, pool.reset_at - now), wait, self.limit))
        return None

    def _granted(self, pool: _Pool, now: float) -> Decision:
        remaining = pool.permits + pool.remaining
        return _new(Decision, (True, remaining, max(0.0, pool.reset_at - now), 0.0, self.limit))

    def _need(self, full: str, cost: int, now: float) -> tuple[int, int]:
        """``(cost_min, cost_max)`` to lease for ``cost``: what the live pool lacks, topped up
        to a whole lease."""
        pool = self._pools.get(full)
        have = pool.permits if pool is not None and pool.expires > now else 0
        return cost - have, max(cost, self.lease) - have

    def _leased(self, full: str, cost: int, verdict: Verdict, now: float) -> Decision:
        """Fold a lease's verdict into ``full``'s pool; the decision for the request."""
        self.leases += 1
        pool = self._pools.get(full)
        if pool is None:
            pool = self._pools[full] = _Pool()
        if pool.expires <= now:
            pool.permits = 0
        result = decision(verdict, self.limit)
        pool.remaining = result[1]
        pool.reset_at = now + result[2]
        if not result[0]:
            pool.refused_until = now + result[3]
            pool.refused_cost = cost
            return result
        pool.refused_until = -INF
        pool.permits += verdict[1] - cost
        pool.expires = now + self.lease_ttl
        return self._granted(pool, now)

    def _sweep(self, now: float) -> None:
        dead = [k for k, p in self._pools.items() if p.expires <= now and p.refused_until <= now]
        for k in dead:
            del self._pools[k]

    def _acquire_steps(self, key: Hashable, cost: int) -> FlowSteps:
        """Spend from the pool; when it is short, lease (one flight at a time, see
        :mod:`floodwall._core.flight`) and look again if another flight landed meanwhile."""
        c = _cost(cost)
        full = self.source._full(key)
        while True:
            with self._lock:
                now = self.clock.monotonic()
                result = self._local(full, c, now)
                if result is None:
                    cmin, cmax = self._need(full, c, now)
            if result is not None:
                break
            lease = Then(self.source._take(full, cmin, cmax), partial(self._fold, full, c))
            result = yield Flight(self._flights, full, lease)
            if result is not LANDED:
                break
        if not result[0]:
            self.source._rejected(key, c, result)
        return result

    def _fold(self, full: str, cost: int, verdict: Verdict) -> Decision:
        with self._lock:
            return self._leased(full, cost, verdict, self.clock.monotonic())

    # -- the gate ---------------------------------------------------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Spend a permit of the call's key from the pool (no ``Wait``), or raise ``Wait``
        for a lease; refusals raise :class:`~floodwall.RateLimitedError`."""
        key = None if self.key is None else self.key(*args, **kwargs)
        return start(self._admission(key))  # type: ignore[no-any-return]

    def _admission(self, key: Hashable) -> FlowSteps:
        result = yield from self._acquire_steps(key, 1)
        if not result[0]:
            raise self._error(result)

    def resume(self, step: Step, value: Any, now: float) -> None:
        return advance(step, value)  # type: ignore[no-any-return]

    def _error(self, result: Decision) -> RateLimitedError:
        retry = None if result[3] == INF else result[3]
        if isinstance(result, StoreDownDecision):
            reason = f"{self.describe()}: the store is unavailable and on_store_error='fail_closed'"
            return LimitStoreUnavailableError(self.name, reason, retry)
        return RateLimitedError(self.name, f"{self.describe()} exceeded", retry)

    # -- observers --------------------------------------------------------------------------

    @property
    def guard(self) -> StoreGuard:
        """The store guard (``state``, counters, ``snapshot()``)."""
        return self.source.guard

    @property
    def rejected(self) -> int:
        """Requests refused since the limiter was built."""
        return self.source.rejected

    def held(self, key: Hashable = None) -> int:
        """Permits of ``key`` leased and not yet spent in this process."""
        with self._lock:
            pool = self._pools.get(self.source._full(key))
            now = self.clock.monotonic()
            return pool.permits if pool is not None and pool.expires > now else 0

    def snapshot(self) -> dict[str, Any]:
        """Counters for metrics: ``leases`` (round trips), ``local_decisions``, and the global
        limiter's."""
        return {
            "leases": self.leases,
            "local_decisions": self.local_decisions,
            **self.source.snapshot(),
        }

    def describe(self) -> str:
        source = self.source
        return (
            f"LeasedLimiter({self.name!r}, {source.algorithm}, {source.rate}, lease={self.lease}, "
            f"lease_ttl={self.lease_ttl:g}s, store={source.store.url})"
        )

    def close(self) -> None:
        """Close the store's sync connections when the limiter made the store (from a URL)."""
        self.source.close()

    async def aclose(self) -> None:
        """Close this event loop's store connections when the limiter made the store."""
        await self.source.aclose()
