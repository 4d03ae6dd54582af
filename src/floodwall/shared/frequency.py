"""Frequency control on a shared store: "once per N seconds" and "at most M per N seconds".

``Frequency.once(per=60, key=...)`` lets one call per key through every ``per`` seconds;
``Frequency(limit=5, per=3600, key=...)`` lets ``limit`` calls per key through per window. The
window starts at a key's first counted call (a fixed window per key, not aligned to the clock),
and a refused call does not count. This is the seeds' ``INCR`` + ``EXPIRE`` (and ``SET NX PX``
for "once") frequency control, run as the fixed-window step that
:class:`~floodwall.ratelimit.FixedWindow` and ``GlobalLimiter("fixed_window")`` run too
(:class:`~floodwall.ratelimit._steps.FixedWindowStep`): on Redis one Lua script
(``lua/ratelimit_fixed.lua``) counts and dates the window atomically on the server's clock, so
no crash between two commands can leave a counter that never expires; every other store runs the
same Python step, on the store's clock.

Keys: ``key`` is a string or a callable that receives the protected call's arguments (``key=lambda
user_id, **_: user_id``); the stored key is ``<prefix>{freq:<name>:<key>}``.

Store outages follow ``on_store_error`` (see :mod:`floodwall.stores.guard`): ``"fail_open"``
(default) admits, ``"fail_closed"`` refuses with :class:`~floodwall.LimitStoreUnavailableError`
(a :class:`~floodwall.RateLimitedError` whose ``kind`` is ``"store_unavailable"``), ``"local"``
counts in this process at ``max(1, limit // expected_instances)`` per window. Decisions made
that way carry ``degraded`` = the mode.

Use ``allow(key)`` / ``await allow_async(key)`` for a :class:`FrequencyDecision`, or the policy
shells (``call``, ``call_async``, decorator), which raise
:class:`~floodwall.RateLimitedError` (``kind="rate_limited"``, ``retry_after`` = seconds until
the window resets) when refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, NamedTuple

from floodwall._core import validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import (
    CircuitOpenError,
    ConfigError,
    LimitStoreUnavailableError,
    RateLimitedError,
)
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all
from floodwall._core.pending import advance, settle_async, start
from floodwall._core.roundtrip import GuardedApply
from floodwall._core.steps import FlowSteps, Step
from floodwall._core.validate import PLAIN_INT
from floodwall.breaker import CircuitBreaker
from floodwall.shared._global_ops import FIXED, Verdict, encode
from floodwall.stores import resolve
from floodwall.stores.base import Arg, Store
from floodwall.stores.guard import Guarded, StoreErrorMode, StoreGuard, mode_field

__all__ = ["Frequency", "FrequencyDecision", "FrequencyOptions"]


@dataclass(frozen=True, slots=True)
class FrequencyOptions:
    """A :class:`Frequency`'s options, validated once: ``limit`` calls (>= 1) per ``per``
    seconds (>= 1 ms), ``on_store_error`` (``fail_open``: a frequency rule is a nicety, not a
    protection) and ``expected_instances`` (1; each keeps ``limit ÷ expected_instances`` when
    the store is down and the mode is ``local``)."""

    limit: int
    per: float
    on_store_error: StoreErrorMode = "fail_open"
    expected_instances: int = 1

    CHECKS: ClassVar[Checks] = {
        "limit": validate.count,
        "per": partial(validate.seconds, minimum=0.001),
        "on_store_error": mode_field,
        "expected_instances": validate.count,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


class FrequencyDecision(NamedTuple):
    """One decision: ``allowed``; ``count`` calls counted in the key's window (after this one,
    when allowed); ``limit``; ``reset_after`` seconds until the window ends (``None`` when
    unknown); ``degraded`` = the ``on_store_error`` mode when the store did not decide.

    A tuple, like :class:`~floodwall.ratelimit.Decision`, built in C on every decision (0.5 µs
    against 2.8 µs for the frozen dataclass it was); always truthy, read ``allowed``."""

    allowed: bool
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as it must
    limit: int
    reset_after: float | None
    degraded: StoreErrorMode | None = None

    @property
    def remaining(self) -> int:
        """Calls still allowed in this window."""
        return max(0, self.limit - self.count)

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before trying again when refused; ``None`` when allowed."""
        return None if self.allowed else self.reset_after


_new: Callable[
    [type[FrequencyDecision], tuple[bool, int, int, float | None, StoreErrorMode | None]],
    FrequencyDecision,
]
_new = tuple.__new__
"""``_new(FrequencyDecision, (allowed, count, limit, reset_after, degraded))``: built in C,
skipping the Python-level ``NamedTuple.__new__`` (every field given: no defaults here)."""


class Frequency(Gate):
    """At most ``limit`` calls per key every ``per`` seconds, across every process sharing the
    store (see [Distributed state][guide-distributed]). ``limit=1`` is "once per ``per`` seconds".

    As a gate: ``admit`` raises ``Wait`` for the guarded store op of the call's key,
    ``resume`` turns the reply into a permit or the rejection; ``record`` learns nothing.
    :meth:`allow` and :meth:`allow_async` settle the same step generator.
    """

    kind = "frequency"

    def __init__(
        self,
        limit: int,
        per: float,
        *,
        key: str | Callable[..., str] | None = None,
        name: str = "frequency",
        store: Store | str | None = None,
        on_store_error: StoreErrorMode = "fail_open",
        expected_instances: int = 1,
        breaker: CircuitBreaker | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = FrequencyOptions(limit, per, on_store_error, expected_instances)
        """The validated :class:`FrequencyOptions`, read once, here."""
        if key is not None and not (callable(key) or (isinstance(key, str) and key)):
            raise ConfigError(f"key must be a non-empty string or a callable, got {key!r}")
        self.limit = limit = o.limit
        self.per = o.per
        self.key = key
        self.name = validate.text("name", name)
        self.expected_instances = o.expected_instances
        self.local_limit = max(1, limit // o.expected_instances)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.store = resolve(store)
        self.guard = StoreGuard(
            self.store,
            on_store_error=o.on_store_error,
            name=name,
            breaker=breaker,
            clock=clock,
            listeners=self.listeners,
        )
        period = encode(max(1, round(self.per * 1_000_000)))  # the window, in whole µs
        self._params: list[Arg] = [encode(limit), period]
        self._local_params: list[Arg] = [encode(self.local_limit), period]
        # one call, the usual request: tuples, which the op's table of parsed requests reads as
        # they are
        self._one: tuple[Arg, ...] = (*self._params, b"1", b"1")
        self._local_one: tuple[Arg, ...] = (*self._local_params, b"1", b"1")
        self._now = clock.monotonic

    @classmethod
    def once(cls, per: float, **options: Any) -> Frequency:
        """One call per key every ``per`` seconds (the seeds' ``SET NX PX``)."""
        return cls(1, per, **options)

    # -- the decision core --------------------------------------------------------------------

    def _request(self, key: str | None, cost: int) -> tuple[str, Sequence[Arg], Sequence[Arg]]:
        """The fixed-window op's key and arguments, on the store and for the local fallback."""
        if cost.__class__ is not PLAIN_INT or not 1 <= cost <= self.limit:
            validate.count("cost", cost, 1, self.limit)
        given: object = key  # a caller's argument: any object may arrive
        if given is not None and not isinstance(given, str):
            validate.text("key", given, error=ValueError)
        full = f"freq:{self.name}" if key is None else f"freq:{self.name}:{key}"
        if cost == 1:
            return full, self._one, self._local_one
        local = encode(min(cost, self.local_limit))
        return (
            full,
            [*self._params, encode(cost), encode(cost)],
            [*self._local_params, local, local],
        )

    def _decide(self, guarded: Guarded[Any]) -> FrequencyDecision:
        down = guarded.down
        if down is None:  # the store decided: the hot path
            allowed, _, remaining, reset_us, _ = guarded.value[1][0]  # type: ignore[index]
            limit = self.limit
            return _new(
                FrequencyDecision, (allowed, limit - remaining, limit, reset_us / 1e6, None)
            )
        if down.mode != "local":
            if down.mode == "fail_open":
                return FrequencyDecision(True, 0, self.limit, None, down.mode)
            retry = down.error.retry_after if isinstance(down.error, CircuitOpenError) else None
            return FrequencyDecision(False, 0, self.limit, retry, down.mode)
        assert guarded.value is not None
        verdict: Verdict = guarded.value[1][0]
        allowed, _, remaining, reset_us, _ = verdict
        limit = self.local_limit
        return FrequencyDecision(allowed, limit - remaining, limit, reset_us / 1_000_000, "local")

    def _key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        key = self.key
        if key is None or isinstance(key, str):
            return key
        return str(key(*args, **kwargs))

    def _rejection(self, key: str | None, decision: FrequencyDecision) -> RateLimitedError:
        if decision.degraded == "fail_closed":
            reason = "the store is unavailable and on_store_error='fail_closed'"
        else:
            what = "once" if self.limit == 1 else f"{self.limit} calls"
            reason = f"{what} per {self.per:g}s for key {key!r} already used"
        if self.listeners:
            self.listeners.emit(
                Event(
                    kind="rejected",
                    source=self.kind,
                    name=self.name,
                    time=self.clock.monotonic(),
                    reason=reason,
                    figures={"count": decision.count, "limit": decision.limit},
                )
            )
        if decision.degraded == "fail_closed":
            return LimitStoreUnavailableError(self.name, reason, decision.retry_after)
        return RateLimitedError(self.name, reason, decision.retry_after)

    def _allow_steps(self, key: str | None, cost: int) -> FlowSteps:
        full, args, local_args = self._request(key, cost)
        return self._decide((yield GuardedApply(self.guard, FIXED, full, args, local_args)))

    # -- the shells ---------------------------------------------------------------------------

    def allow(self, key: str | None = None, *, cost: int = 1) -> FrequencyDecision:
        """Count one call (``cost`` calls) for ``key`` if the limit allows it; never raises a
        store error."""
        # the one step of _allow_steps, performed here: no generator to settle (a fifth of
        # a decision on memory://, benchmarks/million_keys.py)
        if key.__class__ is str and cost.__class__ is PLAIN_INT and cost == 1:  # _request, inlined
            full = f"freq:{self.name}:{key}"
            store = self.guard.in_process  # StoreGuard.apply's own rule, without its frame
            if store is not None and self.guard.breaker.lane is not None:
                # StoreGuard.apply's shortcut and _decide's hot path, inlined: two frames less
                # per decision, for the cold ones that make the tail (docs/distributed.md)
                allowed, _, remaining, reset_us, _ = store.apply(FIXED, full, self._one)[1][0]
                limit = self.limit
                return _new(
                    FrequencyDecision, (allowed, limit - remaining, limit, reset_us / 1e6, None)
                )
            guarded = self.guard.apply(FIXED, full, self._one, self._local_one)
        else:
            guarded = self.guard.apply(FIXED, *self._request(key, cost))
        return self._decide(guarded)

    async def allow_async(self, key: str | None = None, *, cost: int = 1) -> FrequencyDecision:
        """:meth:`allow` for async callers."""
        return await settle_async(self._allow_steps(key, cost))  # type: ignore[no-any-return]

    # -- the gate -----------------------------------------------------------------------------

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``Wait`` for the store op of the call's key; :meth:`resume` admits or raises
        :class:`~floodwall.RateLimitedError`."""
        return start(self._admission(self._key_of(args, kwargs)))  # type: ignore[no-any-return]

    def _admission(self, key: str | None) -> FlowSteps:
        decision = yield from self._allow_steps(key, 1)
        if not decision.allowed:
            raise self._rejection(key, decision)

    def resume(self, step: Step, value: Any, now: float) -> None:
        return advance(step, value)  # type: ignore[no-any-return]

    def describe(self) -> str:
        what = "once" if self.limit == 1 else f"{self.limit}"
        return (
            f"Frequency({self.name!r}, {what} per {self.per:g}s, store={self.store.url}, "
            f"on_store_error={self.guard.mode})"
        )
