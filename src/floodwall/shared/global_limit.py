"""Global rate limits: one limit shared by every process, kept in a store.

``GlobalLimiter("gcra", "100/s", burst=10, store="redis://…")`` is the in-memory
:class:`~floodwall.ratelimit.GCRA` with its state in Redis (or Redis Cluster, PostgreSQL,
SQLite, memory): every process asking the same store for the same ``name`` and key shares one
limit. The four algorithms are those of :mod:`floodwall.ratelimit`, with the same promises and
the same :class:`~floodwall.ratelimit.Decision`:

======================================  ========================================================
``"fixed_window"`` (``"fixed"``)        ``count`` per window opened by the first request
``"sliding_window_counter"``            the weighted two-window estimate, grid-aligned
``"token_bucket"`` (``"token"``)        ``capacity = 1 + burst`` tokens refilled at ``rate``
``"gcra"``                              the token bucket as one timestamp
======================================  ========================================================

**One round trip per decision**, atomic on the store (a Lua script called by SHA on Redis; one
transaction on SQL), timed by the store's clock alone (Redis ``TIME``, in whole microseconds):
the ops are in :mod:`floodwall.shared._global_ops`. Keys are ``<prefix>{rl:<name>[:<key>]}``
(one hash tag, so Redis Cluster works) and expire once their state is fresh again.

**Batching** (async): concurrent ``acquire_async`` calls on one key are coalesced, the requests
that arrive while one round trip is in flight going together in the next one (one ``EVALSHA``
deciding the whole batch, in arrival order): N concurrent callers cost about one round trip per N
decisions. A lone caller is sent at once. ``batch=False`` sends every request on its own.

**When the store is down** (``on_store_error``, through a
:class:`~floodwall.stores.StoreGuard`): ``"local"`` (default) keeps limiting in this process at
the limit ÷ ``expected_instances`` (the same algorithm on an in-process store), so the fleet
stays near its limit; ``"fail_open"`` admits; ``"fail_closed"`` refuses (``retry_after`` = until
the store is probed again) with a :class:`~floodwall.ratelimit.StoreDownDecision`, raised as
:class:`~floodwall.LimitStoreUnavailableError` (``kind="store_unavailable"``: HTTP 503, not
429, for the outage is floodwall's, not the caller's rate). A breaker makes an outage cost a
few fast failures, not a timeout per request, and the limiter returns to the store by itself
when it answers; events ``store_down`` / ``store_up`` go to the listeners and
``limiter.guard.snapshot()`` has the counters. No store error ever reaches the caller.

As a :class:`~floodwall.Policy` (``call``, ``call_async``, decorator) a refused call raises
:class:`~floodwall.RateLimitedError` with ``retry_after``; ``max_wait`` > 0 waits instead (at
most that long, never past the ambient deadline) and retries after ``retry_after``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import (
    CircuitOpenError,
    ConfigError,
    LimitStoreUnavailableError,
    RateLimitedError,
)
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.pending import advance, settle, settle_async, start
from floodwall._core.roundtrip import Batched, GuardedApply, Lanes, Then
from floodwall._core.steps import FlowSteps, Sleep, Step
from floodwall._core.tally import Tally
from floodwall.breaker import CircuitBreaker
from floodwall.context import _DEADLINE
from floodwall.ratelimit._base import (
    _MIN_SLEEP,
    INF,
    Decision,
    Rate,
    RateLike,
    StoreDownDecision,
    max_wait_field,
    parse_rate,
    rate_field,
)
from floodwall.shared._coalesce import Coalescer
from floodwall.shared._global_ops import (
    ALGORITHMS,
    RESET,
    STORE_DOWN,
    Plan,
    Verdict,
    decision,
    encode,
    plan,
)
from floodwall.stores import resolve
from floodwall.stores.base import Arg, Store
from floodwall.stores.guard import Guarded, StoreErrorMode, StoreGuard, mode_field

__all__ = ["GlobalLimitOptions", "GlobalLimiter"]


def algorithm_field(name: str, value: object) -> str:
    """A shared limit's ``algorithm``: a name or alias the store ops run (kept as given)."""
    if not isinstance(value, str) or value not in ALGORITHMS:
        raise ConfigError(
            f"{name} must be one of {', '.join(sorted(set(ALGORITHMS.values())))} "
            f"(or fixed, sliding, token), got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class GlobalLimitOptions:
    """A :class:`GlobalLimiter`'s options, validated once (the store, its key function and its
    breaker are what it is wired to, not options).

    ``algorithm`` (``fixed_window``, ``sliding_window_counter``, ``token_bucket``, ``gcra`` or
    an alias), ``rate`` (kept as a :class:`~floodwall.ratelimit.Rate`), ``burst`` (buckets only;
    ``None``: ``rate.count - 1``), ``initial`` (token bucket only), ``on_store_error``
    (``local``), ``expected_instances`` (1), ``max_wait`` (0 s), ``batch`` (coalesce async round
    trips, on) and ``max_batch`` (512).
    """

    algorithm: str
    rate: RateLike
    burst: int | None = None
    initial: float | None = None
    on_store_error: StoreErrorMode = "local"
    expected_instances: int = 1
    max_wait: float = defaults.RATE_LIMIT_MAX_WAIT
    batch: bool = True
    max_batch: int = defaults.GLOBAL_MAX_BATCH

    CHECKS: ClassVar[Checks] = {
        "algorithm": algorithm_field,
        "rate": rate_field,
        "burst": optional(partial(validate.count, minimum=0)),
        "initial": optional(partial(validate.number, low=0.0)),
        "on_store_error": mode_field,
        "expected_instances": validate.count,
        "max_wait": max_wait_field,
        "batch": validate.flag,
        "max_batch": validate.count,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        self.plan()  # the rules between fields (burst for buckets only, the exact bound, …)

    def plan(self) -> Plan:
        """The store op and its arguments these options run."""
        assert isinstance(self.rate, Rate)  # normalised by its check
        return plan(self.algorithm, self.rate, self.burst, self.initial)


Pair = tuple[int, int]
"""A request as the ops take it: ``(cost_min, cost_max)``."""


def _cost(cost: int) -> int:
    if not isinstance(cost, int) or isinstance(cost, bool) or cost < 0:
        raise ValueError(f"cost must be an integer >= 0 for a global limit, got {cost!r}")
    return cost


def local_share(algorithm: str, rate: Rate, burst: int | None, instances: int) -> Plan:
    """The plan for one process's share of a limit: count and capacity ÷ ``instances`` (at
    least 1), the same period."""
    full = plan(algorithm, rate, burst, None)
    if instances == 1:
        return full
    share = Rate(max(1, rate.count // instances), rate.period)
    if full.algorithm in {"token_bucket", "gcra"}:
        return plan(algorithm, share, max(1, full.limit // instances) - 1, None)
    return plan(algorithm, share, None, None)


class _Acquiring:
    """``acquire`` and ``try_acquire`` in both worlds: each settles the one step generator
    ``_acquire_steps(key, cost)`` of the limiter (in a thread, or in a task)."""

    def _acquire_steps(self, key: Hashable, cost: int) -> FlowSteps:
        raise NotImplementedError

    def acquire(self, key: Hashable = None, cost: int = 1) -> Decision:
        """Take ``cost`` permits of ``key``'s limit now if possible; never raises a store error
        (``on_store_error`` decides when the store is down)."""
        return settle(self._acquire_steps(key, cost))  # type: ignore[no-any-return]

    async def acquire_async(self, key: Hashable = None, cost: int = 1) -> Decision:
        """:meth:`acquire` for async callers."""
        return await settle_async(self._acquire_steps(key, cost))  # type: ignore[no-any-return]

    def try_acquire(self, key: Hashable = None, cost: int = 1) -> bool:
        """Whether ``cost`` permits were taken now."""
        return self.acquire(key, cost)[0]

    async def try_acquire_async(self, key: Hashable = None, cost: int = 1) -> bool:
        """:meth:`try_acquire` for async callers."""
        return (await self.acquire_async(key, cost))[0]


class GlobalLimiter(_Acquiring, Gate):
    """A rate limit shared through a store (see [Distributed state][guide-distributed]).

    As a gate: ``admit`` raises ``Wait`` for the store round trip of the call's key (a
    :class:`~floodwall._core.roundtrip.Batched` step: coalesced in a task), ``resume`` turns
    the verdict into a permit or the :class:`~floodwall.RateLimitedError`; with ``max_wait``
    the same steps as :meth:`wait` (round trips and ``Sleep``) run. ``record`` learns nothing.
    Concurrent ``acquire_async`` calls on one key share round trips (see
    [Distributed state][guide-distributed]).

    ``algorithm``: ``"gcra"``, ``"token_bucket"``, ``"sliding_window_counter"`` or
    ``"fixed_window"``. ``rate``: ``"100/s"``, ``"5/h"``, a :class:`Rate` or permits per second.
    ``burst`` (token bucket, GCRA): permits beyond one at a time, default ``count - 1``.
    ``initial`` (token bucket): a new key's tokens, default a full bucket. ``store``: a
    :class:`~floodwall.stores.Store` or its URL (``prefix`` then goes to
    :func:`~floodwall.stores.connect`). ``key``: a function of the protected call's arguments
    giving the key, for use as a policy. ``expected_instances``: processes sharing the limit,
    for the ``"local"`` fallback.
    """

    kind = "rate_limiter"

    def __init__(
        self,
        algorithm: str,
        rate: RateLike,
        *,
        burst: int | None = None,
        initial: float | None = None,
        store: Store | str | None = None,
        prefix: str | None = None,
        name: str = "global",
        key: Callable[..., Hashable] | None = None,
        on_store_error: StoreErrorMode = "local",
        expected_instances: int = 1,
        breaker: CircuitBreaker | None = None,
        max_wait: float = defaults.RATE_LIMIT_MAX_WAIT,
        batch: bool = True,
        max_batch: int = defaults.GLOBAL_MAX_BATCH,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = GlobalLimitOptions(
            algorithm,
            rate,
            burst,
            initial,
            on_store_error,
            expected_instances,
            max_wait,
            batch,
            max_batch,
        )
        """The validated :class:`GlobalLimitOptions`, read once, here."""
        self.rate = parse_rate(o.rate)
        self.plan = o.plan()
        self.algorithm = self.plan.algorithm
        self.burst = o.burst
        self.limit = self.plan.limit
        """The quota reported as ``RateLimit-Limit`` (``count``; ``1 + burst`` for buckets)."""
        self.window = self.plan.window
        self.expected_instances = o.expected_instances
        self.local_plan = local_share(o.algorithm, self.rate, o.burst, o.expected_instances)
        if key is not None and not callable(key):
            raise ConfigError(f"key must be a callable of the call's arguments, got {key!r}")
        self.max_batch = o.max_batch
        self.name = validate.text("name", name)
        self.key = key
        self.max_wait = o.max_wait
        self.batch = o.batch
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._owns_store = isinstance(store, str)
        if prefix is not None and not isinstance(store, str):
            raise ConfigError(
                "prefix applies when store is a URL; set it on the Store itself otherwise"
            )
        self.store = resolve(store) if prefix is None else resolve(store, prefix=prefix)
        self.guard = StoreGuard(
            self.store,
            on_store_error=o.on_store_error,
            name=name,
            breaker=breaker,
            clock=clock,
            listeners=self.listeners,
        )
        self._base = f"rl:{name}"
        self._op = self.plan.op
        self._params: list[Arg] = list(self.plan.params)
        self._local_params: list[Arg] | None = (
            list(self.local_plan.params) if self.guard.mode == "local" else None
        )
        self._lanes: Lanes[Pair, Verdict] | None = (
            Lanes(self._round_trip, self._coalescer) if self.batch else None
        )
        self._now = clock.monotonic
        self._rejections = Tally()
        self._reason = f"{self.describe()} exceeded"

    # -- the decision core ----------------------------------------------------------------

    def _full(self, key: Hashable) -> str:
        return self._base if key is None else f"{self._base}:{key}"

    def _verdicts(self, guarded: Guarded[Any], pairs: list[Pair]) -> list[Verdict]:
        """The store's verdicts, or the ``on_store_error`` mode's when it did not answer."""
        down = guarded.down
        if down is None or down.mode == "local":
            value = guarded.value
            assert value is not None
            verdicts: list[Verdict] = value[1]
            return verdicts
        if down.mode == "fail_open":
            return [(True, cmin, self.limit, 0, 0) for cmin, _ in pairs]
        error = down.error
        retry = error.retry_after if isinstance(error, CircuitOpenError) else None
        retry_us = round(1_000_000 * (defaults.STORE_BREAKER_OPEN if retry is None else retry))
        return [(False, STORE_DOWN, 0, retry_us, retry_us) for _ in pairs]

    def _args(self, pairs: list[Pair]) -> tuple[list[Arg], list[Arg] | None]:
        """The op's arguments for ``pairs`` on the store, and for the in-process fallback."""
        flat: list[Arg] = [encode(x) for pair in pairs for x in pair]
        local = self._local_params
        return self._params + flat, None if local is None else local + flat

    def _round_trip(self, key: str, pairs: list[Pair]) -> Step:
        """The step of one round trip deciding ``pairs`` in order; its value, their verdicts."""
        args, local = self._args(pairs)
        apply = GuardedApply(self.guard, self._op, key, args, local, callers=len(pairs))
        return Then(apply, partial(self._verdicts, pairs=pairs))

    def _coalescer(
        self, send: Callable[[str, list[Pair]], Awaitable[list[Verdict]]]
    ) -> Coalescer[Pair, Verdict]:
        """One event loop's coalescer: a queued request waits at most the store's timeout
        behind a batch in flight, then takes the ``on_store_error`` answer (:meth:`_stuck`)."""
        bound = self.store.timeout
        return Coalescer(send, self.max_batch, bound, None if bound is None else self._stuck)

    async def _stuck(self, key: str, pairs: list[Pair]) -> list[Verdict]:
        """The ``on_store_error`` verdicts for requests stuck behind a batch past the timeout."""
        args, local = self._args(pairs)
        guarded = await self.guard.gave_up_async(self._op, key, args, local, len(pairs))
        return self._verdicts(guarded, pairs)

    def _take(self, key: str, cmin: int, cmax: int) -> Step:
        """The step of one request on the store (admitted with at least ``cmin``, at most
        ``cmax``), coalesced with concurrent requests on ``key`` in a task; its verdict."""
        return Batched(self._round_trip, self._lanes, key, (cmin, cmax))

    def _key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        return None if self.key is None else self.key(*args, **kwargs)

    def _acquire_steps(self, key: Hashable, cost: int) -> FlowSteps:
        c = _cost(cost)
        result = decision((yield self._take(self._full(key), c, c)), self.limit)
        if not result[0]:
            self._rejected(key, c, result)
        return result

    def _wait_steps(self, key: Hashable, cost: int, max_wait: float | None) -> FlowSteps:
        c = _cost(cost)
        until = self._until(max_wait)
        full = self._full(key)
        while True:
            result = decision((yield self._take(full, c, c)), self.limit)
            if result[0]:
                return result
            pause = self._pause(result, until)
            if pause < 0:
                self._rejected(key, c, result)
                return result
            yield Sleep(self.clock, pause)

    def _reset_steps(self, key: Hashable) -> FlowSteps:
        yield GuardedApply(self.guard, RESET, self._full(key), ())

    def _until(self, max_wait: float | None) -> float:
        bound = (
            self.max_wait
            if max_wait is None
            else validate.seconds("max_wait", max_wait, infinite=True, error=ValueError)
        )
        outer = _DEADLINE.get()
        if outer is not None:
            bound = min(bound, outer.remaining())
        return self.clock.monotonic() + bound

    def _pause(self, result: Decision, until: float) -> float:
        """Seconds to sleep before asking again, or -1 when the wait would overrun ``until``."""
        retry = result[3]
        if retry == INF or self.clock.monotonic() + retry > until:
            return -1.0
        return max(retry, _MIN_SLEEP)

    # -- the shells: one set of steps each, settled in a thread or a task ------------------

    def wait(
        self, key: Hashable = None, cost: int = 1, *, max_wait: float | None = None
    ) -> Decision:
        """Take ``cost`` permits, sleeping ``retry_after`` between tries, for at most
        ``max_wait`` seconds (default: the limiter's) and never past the ambient deadline."""
        return settle(self._wait_steps(key, cost, max_wait))  # type: ignore[no-any-return]

    async def wait_async(
        self, key: Hashable = None, cost: int = 1, *, max_wait: float | None = None
    ) -> Decision:
        """:meth:`wait` for async callers."""
        return await settle_async(self._wait_steps(key, cost, max_wait))  # type: ignore[no-any-return]

    def reset(self, key: Hashable = None) -> None:
        """Forget what ``key`` consumed, on the store (operator action)."""
        settle(self._reset_steps(key))

    async def reset_async(self, key: Hashable = None) -> None:
        """:meth:`reset` for async callers."""
        await settle_async(self._reset_steps(key))

    # -- the gate ---------------------------------------------------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``Wait`` for the round trip of the call's key (and, with ``max_wait``, the
        sleeps between tries); :meth:`resume` admits or raises the rejection."""
        key = self._key_of(args, kwargs)
        paced = self.max_wait != 0 or _DEADLINE.get() is not None
        return start(self._admission(key, paced))  # type: ignore[no-any-return]

    def _admission(self, key: Hashable, paced: bool) -> FlowSteps:
        steps = self._wait_steps(key, 1, None) if paced else self._acquire_steps(key, 1)
        result = yield from steps
        if not result[0]:
            raise self._error(result)

    def resume(self, step: Step, value: Any, now: float) -> None:
        return advance(step, value)  # type: ignore[no-any-return]

    # -- rejections and observers -----------------------------------------------------------

    def _rejected(self, key: Hashable, cost: int, result: Decision) -> None:
        self._rejections.add()
        if self.listeners:
            self.listeners.emit(
                Event(
                    kind="rejected",
                    source=self.kind,
                    name=self.name,
                    time=self.clock.monotonic(),
                    reason=self._why(result),
                    figures={
                        "key": key,
                        "cost": cost,
                        "limit": result[4],
                        "remaining": result[1],
                        "retry_after": result[3],
                        "store": self.guard.state,
                    },
                )
            )

    def _why(self, result: Decision) -> str:
        if isinstance(result, StoreDownDecision):
            return f"{self.describe()}: the store is unavailable and on_store_error='fail_closed'"
        return self._reason

    def _error(self, result: Decision) -> RateLimitedError:
        retry = None if result[3] == INF else result[3]
        if isinstance(result, StoreDownDecision):
            return LimitStoreUnavailableError(self.name, self._why(result), retry)
        return RateLimitedError(self.name, self._reason, retry)

    @property
    def rejected(self) -> int:
        """Requests refused since the limiter was built."""
        return self._rejections.value

    @property
    def batches(self) -> int:
        """Round trips made by the async shell's coalescers (in live event loops)."""
        return 0 if self._lanes is None else sum(c.batches for c in self._lanes)

    def snapshot(self) -> dict[str, Any]:
        """Counters for metrics: ``rejected``, and the store guard's (``state``, ``outages``,
        ``recoveries``, ``failures``, ``short_circuits``, ``degraded``)."""
        return {"rejected": self.rejected, **self.guard.snapshot()}

    def describe(self) -> str:
        burst = f", burst={self.limit - 1}" if self.algorithm in {"token_bucket", "gcra"} else ""
        return (
            f"GlobalLimiter({self.name!r}, {self.algorithm}, {self.rate}{burst}, "
            f"store={self.store.url}, on_store_error={self.guard.mode})"
        )

    def close(self) -> None:
        """Close the store's sync connections when the limiter made the store (from a URL)."""
        if self._owns_store:
            self.store.close()

    async def aclose(self) -> None:
        """Close the store's connections in this event loop when the limiter made the store."""
        if self._owns_store:
            await self.store.aclose()
