"""Hedging: when the first attempt is slow, start another and take whichever answers first.

For idempotent reads only. ``Hedge(delay, max_hedges=1)`` starts the call; if it has not answered
after ``delay`` seconds it starts a hedge (a second attempt) beside it, and so on up to
``max_hedges`` extra attempts, one every ``delay``. The first success wins and every other
attempt is cancelled. The delay is fixed, or, with ``percentile=0.95``, the 95th percentile of
recent answer latencies (the tail-at-scale recipe: Dean & Barroso, "The Tail at Scale", CACM
2013, hedged requests after the p95 cost about 5 % more load), the fixed ``delay`` standing in
until ``min_samples`` latencies have been seen.

Hedges are extra load, so they count against a :class:`~floodwall.RetryBudget` like retries
(by default a private one; share the dependency's budget with its :class:`~floodwall.Retry`), and
each runs under a :class:`~floodwall.RetryMarker` so that the layers below do not retry it. For
the same reason a call that itself runs under a marker (a retry of some layer above) is not
hedged (``respect_marker=False`` hedges it anyway).

By default a hedge answers slowness, not failure: an attempt that fails does not start another
one. With ``on_failure=True`` (Polly v8's hedging strategy) a transient failure also starts the
next attempt at once, within ``max_hedges`` and the budget. A transient failure (see
:mod:`floodwall.classify`) lets the attempts still running carry on; any other failure ends the
call at once; when every attempt has failed, the last error is raised. Put a
:class:`~floodwall.Retry` outside the hedge to retry failures with backoff.

Async only (``call_async``, or decorating an ``async def``): a sync call cannot be cancelled, so
a sync hedge would leave its losers running in threads; ``call`` raises :class:`ConfigError`.
Cancelled losers are not awaited: the winner's answer is returned at once and the losers end in
the background (their exceptions are retrieved, so nothing is logged).

Latency is kept in a :class:`~floodwall.TimeWindow` of the winners' durations (each from its own
start); the percentile is recomputed at most once per bucket.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, ParamSpec, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Scoped
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.outcome import Kind
from floodwall._core.race import Race
from floodwall._core.tally import Tally
from floodwall._core.window import TimeWindow
from floodwall.budget import RetryBudget
from floodwall.classify import DEFAULT_CLASSIFIER, Classifier, ErrorClass, _describe
from floodwall.context import _RETRY, RetryMarker

__all__ = ["Hedge", "HedgeOptions"]


def _classifier(name: str, value: object) -> Classifier:
    if not isinstance(value, Classifier):
        raise ConfigError(f"{name} must be a floodwall Classifier, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class HedgeOptions:
    """A :class:`Hedge`'s options, validated once: ``delay`` (seconds before a hedge starts,
    > 0), ``max_hedges`` (extra attempts, 1), ``percentile`` (in ``(0, 1)``: the delay becomes
    that percentile of the recent latencies once ``min_samples``, 20, are known; ``None``: the
    fixed delay), ``classifier``, ``respect_marker`` (no hedge inside a retry, on),
    ``on_failure`` (hedge also on a failed first attempt, off) and the latency window
    (``window`` seconds in ``buckets``). The retry budget is what it is wired to, not an
    option."""

    delay: float
    max_hedges: int = defaults.HEDGE_MAX_HEDGES
    percentile: float | None = None
    min_samples: int = defaults.HEDGE_MIN_SAMPLES
    classifier: Classifier = DEFAULT_CLASSIFIER
    respect_marker: bool = True
    on_failure: bool = False
    window: float = defaults.RETRY_BUDGET_WINDOW
    buckets: int = defaults.RETRY_BUDGET_BUCKETS

    CHECKS: ClassVar[Checks] = {
        "delay": partial(validate.seconds, positive=True),
        "max_hedges": validate.count,
        "percentile": optional(
            partial(validate.number, low=0.0, high=1.0, low_open=True, high_open=True)
        ),
        "min_samples": validate.count,
        "classifier": _classifier,
        "respect_marker": validate.flag,
        "on_failure": validate.flag,
        "window": partial(validate.seconds, positive=True),
        "buckets": partial(validate.count, maximum=defaults.MAX_SLOTS),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)


P = ParamSpec("P")
R = TypeVar("R")

_DEFAULT_BUDGET: Any = object()


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve a finished loser's exception so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class Hedge(Scoped):
    """Start up to ``max_hedges`` extra attempts of a slow call; the first success wins."""

    kind = "hedge"

    def __init__(
        self,
        delay: float,
        *,
        max_hedges: int = defaults.HEDGE_MAX_HEDGES,
        percentile: float | None = None,
        min_samples: int = defaults.HEDGE_MIN_SAMPLES,
        budget: RetryBudget | None = _DEFAULT_BUDGET,
        classifier: Classifier = DEFAULT_CLASSIFIER,
        respect_marker: bool = True,
        on_failure: bool = False,
        window: float = defaults.RETRY_BUDGET_WINDOW,
        buckets: int = defaults.RETRY_BUDGET_BUCKETS,
        name: str = "hedge",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = HedgeOptions(
            delay,
            max_hedges,
            percentile,
            min_samples,
            classifier,
            respect_marker,
            on_failure,
            window,
            buckets,
        )
        """The validated :class:`HedgeOptions`, read once, here."""
        if budget is _DEFAULT_BUDGET:
            budget = RetryBudget(name=f"{name}.budget", clock=clock)
        elif budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigError(f"budget must be a RetryBudget or None, got {budget!r}")
        self.delay = o.delay
        self.max_hedges = o.max_hedges
        self.percentile = o.percentile
        self.min_samples = o.min_samples
        self.budget: RetryBudget | None = budget
        if budget is not None:
            budget.attach()
        self.classifier = o.classifier
        self.respect_marker = o.respect_marker
        self.on_failure = o.on_failure
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._latency = TimeWindow(o.buckets, o.window / o.buckets)
        self._lock = threading.Lock()
        self._cached = self.delay
        self._cached_until = -float("inf")
        self._background: set[asyncio.Task[Any]] = set()
        self._calls = Tally()
        self._hedges = Tally()
        self._hedge_wins = Tally()
        self._refusals = Tally()
        self.scope = Race(self)  # every call's race (the budget entered as it starts)

    # -- the pure parts ---------------------------------------------------------------------

    def current_delay(self, now: float) -> float:
        """Seconds to wait before the next hedge: ``delay``, or the latency percentile once the
        window holds ``min_samples`` answers (recomputed at most once per bucket)."""
        q = self.percentile
        if q is None:
            return self.delay
        if now < self._cached_until:
            return self._cached
        with self._lock:
            snap = self._latency.snapshot(now)
            value = snap.percentile(q) if snap.calls >= self.min_samples else None
            self._cached = self.delay if value is None or value <= 0 else value
            self._cached_until = now + self._latency.bucket_seconds
            return self._cached

    def record(self, now: float, duration: float) -> None:
        """Count one answer's latency (the winner's, from its own start)."""
        if not self._latency.add_success(now, duration):
            with self._lock:
                self._latency.record(now, Kind.SUCCESS, duration)

    # -- the step (a Race in the core runs the tasks; these hooks decide) --------------------

    def _enter(self, start: float) -> Any:
        self._calls.add()
        return None if self.budget is None else self.budget.enter(start)

    def _leave(self, token: Any) -> None:
        if self.budget is not None:
            self.budget.leave(token)

    def _more(self) -> bool:
        # not under a retry of a layer above: no extra load from here
        return not (self.respect_marker and _RETRY.get() is not None)

    def _delay(self) -> Awaitable[None]:
        return self.clock.async_sleep(self.current_delay(self._now()))

    def _ends_race(self, failure: BaseException) -> bool:
        return self.classifier.classify(failure) is not ErrorClass.TRANSIENT

    def _all_failed(self, error: BaseException, launched: int) -> None:
        if launched > 1:
            error.add_note(
                f"floodwall: hedge {self.name!r}: all {launched} attempts failed "
                f"(last: {_describe(error, None)})"
            )

    def _may_hedge(self, launched: int) -> bool:
        budget = self.budget
        now = self._now()
        if budget is None or budget.try_withdraw(now):
            return True
        self._refusals.add()
        if self.listeners:
            refused = budget.exhausted(self.name, now)
            self.listeners.emit(
                Event(
                    "budget_exhausted",
                    self.kind,
                    self.name,
                    now,
                    refused.reason,
                    figures={"attempts": launched},
                )
            )
        return False

    def _launch(
        self, loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[Any]], attempt: int
    ) -> asyncio.Task[Any]:
        self._hedges.add()
        context = contextvars.copy_context()
        context.run(_RETRY.set, RetryMarker(attempt, self.name))
        if self.listeners:
            self.listeners.emit(
                Event(
                    "hedge_started",
                    self.kind,
                    self.name,
                    self._now(),
                    f"attempt {attempt} started: no answer yet",
                    figures={"attempt": attempt},
                )
            )
        return loop.create_task(call(), context=context)  # type: ignore[arg-type]

    def _won(self, result: R, attempt: int, began: float, launched: int) -> R:
        now = self._now()
        self.record(now, now - began)
        if attempt > 1:
            self._hedge_wins.add()
        if self.listeners and launched > 1:
            self.listeners.emit(
                Event(
                    "hedge_answered",
                    self.kind,
                    self.name,
                    now,
                    f"attempt {attempt} of {launched} answered first",
                    figures={"attempt": attempt, "attempts": launched},
                )
            )
        return result

    def _abandon(
        self, running: dict[asyncio.Task[Any], tuple[int, float]], timer: asyncio.Task[None] | None
    ) -> None:
        """Cancel every attempt still running (and the timer) without waiting for them."""
        if timer is not None:
            timer.cancel()
        for task in running:
            task.cancel()
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(_consume)

    # -- observers --------------------------------------------------------------------------

    @property
    def calls(self) -> int:
        """Calls made through this policy."""
        return self._calls.value

    @property
    def hedges(self) -> int:
        """Extra attempts started."""
        return self._hedges.value

    @property
    def hedge_wins(self) -> int:
        """Calls answered by a hedge rather than by the first attempt."""
        return self._hedge_wins.value

    @property
    def budget_refusals(self) -> int:
        """Hedges the budget refused."""
        return self._refusals.value

    def describe(self) -> str:
        delay = f"{self.delay:g}s"
        if self.percentile is not None:
            delay = f"p{self.percentile * 100:g} (else {delay})"
        return f"Hedge({self.name!r}, delay={delay}, max_hedges={self.max_hedges})"
