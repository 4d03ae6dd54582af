"""Retries that never storm.

A retry raises the success rate of one call and, done naively, takes a whole system down: a chain
of three services over a database, each trying 3 times, turns one request into 3 × 3 × 3 = 27
database calls exactly when the database is already failing. :class:`Retry` retries only what a
retry can fix, and keeps the total small:

* **what**: the failure's :class:`~floodwall.classify.ErrorClass`. Business errors are never
  retried, overload signals (HTTP 429/503, open breakers, rate limits, full bulkheads) not by
  default (``retry_overload=True``: only after their ``retry_after``), transient network errors
  are, and so are the types listed in ``retry_on`` and results flagged by ``retry_on_result``.
  ``Retry-After`` is honoured (the wait is at least that, capped at ``max_retry_after``).
* **how often**: ``attempts`` in total (default 3), each retry after the
  :mod:`~floodwall.backoff` delay (default exponential with full jitter).
* **when not**: never past the ambient :func:`floodwall.deadline` (or the policy's own
  ``deadline``): a retry is scheduled only if its delay plus an attempt as long as the last one
  ends before the time left. Never for non-idempotent work (``idempotent=False``) unless the call
  carries a :func:`floodwall.idempotency_key`. Never for a dependency whose ``level`` is above
  ``max_level`` (level 3, "nice to have", fails fast), nor while :meth:`Retry.disable` is on.
* **not twice**: while an attempt is a retry the context holds a
  :class:`~floodwall.RetryMarker`; a nested ``Retry`` that sees one does not retry (the layer
  above already does). Symmetrically, a failure that a nested ``Retry`` already retried, or that
  its budget refused, is not retried again by an enclosing one. ``respect_marker=False`` turns
  both off.
* **not too many**: every retry must be granted by a :class:`~floodwall.RetryBudget` (by
  default a private one; share one per dependency or per process), which keeps retries under
  ``ratio`` (10 %) of the requests over a rolling window.

When it stops, the caller gets the last error, unchanged but for a note (PEP 678) and a
:class:`GaveUp` record (:func:`gave_up`) when something non-obvious happened: retries were made,
or the budget, deadline, idempotency guard, level or switch refused one. A result flagged as
failed is returned as is.

Events (``Event.kind``): ``attempt`` (every attempt, ``figures["attempt"]``),
``retry_scheduled`` (delay and reason), ``budget_exhausted`` and ``given_up`` (attempts, last
error, cause). Counters: :attr:`Retry.calls`, :attr:`~Retry.retries`, :attr:`~Retry.recovered`,
:attr:`~Retry.failed`, :attr:`~Retry.budget_refusals`.

Cost: the first attempt's success path reads the clock once and counts the request in the budget
with one atomic counter bump; nothing is allocated and no context variable is set unless the
budget is shared by several policies (then one, so nested policies count a request once) or the
policy has its own ``deadline``. The decision core (:meth:`Retry.decide`) exists once; the sync
and async shells only differ in how they sleep.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import Token
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Final, Literal, ParamSpec, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Attempts
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.outcome import NOTHING, Outcomes
from floodwall._core.steps import CALL, FlowSteps, Sleep
from floodwall._core.tally import Tally
from floodwall.backoff import Backoff, FullJitter, Rng
from floodwall.budget import RetryBudget, RetryBudgetExhausted
from floodwall.classify import DEFAULT_CLASSIFIER, Classifier, ErrorClass, _describe
from floodwall.context import (
    _BUDGETS,
    _DEADLINE,
    _IDEMPOTENCY_KEY,
    _RETRY,
    Deadline,
    RetryMarker,
)

__all__ = ["Cause", "GaveUp", "Retry", "RetryOptions", "RetryState", "gave_up"]

P = ParamSpec("P")
R = TypeVar("R")

Cause = Literal[
    "business",
    "overload",
    "not_retryable",
    "attempts",
    "disabled",
    "level",
    "marker",
    "retried_below",
    "idempotency",
    "deadline",
    "budget",
]
"""Why a :class:`Retry` stopped retrying a call."""

_QUIET: Final = frozenset(
    {"business", "overload", "not_retryable", "attempts", "marker", "retried_below"}
)
"""Causes that leave a first-attempt error untouched (no note, no record): nothing surprising
happened (``attempts=1`` asks for no retry), or the decision belongs to another layer."""

_STOP: Final = -1.0
_TRANSIENT = ErrorClass.TRANSIENT
_OVERLOAD = ErrorClass.OVERLOAD
_BUSINESS = ErrorClass.BUSINESS
_UNKNOWN = ErrorClass.UNKNOWN
_RECORD = "__floodwall_gave_up__"
_DEFAULT_BUDGET: Any = object()
"""Sentinel: give the policy its own private :class:`RetryBudget`."""


@dataclass(frozen=True, slots=True)
class GaveUp:
    """Why a :class:`Retry` stopped: attached to the error the caller receives."""

    policy: str
    attempts: int
    cause: Cause
    reason: str
    budget: RetryBudgetExhausted | None = None
    """The budget's refusal, when ``cause == "budget"``."""

    @property
    def final(self) -> bool:
        """Whether enclosing retries should leave this failure alone: it was retried already,
        or a budget refused to retry it."""
        return self.attempts > 1 or self.cause == "budget"


def gave_up(exc: BaseException) -> GaveUp | None:
    """The :class:`GaveUp` record a :class:`Retry` attached to ``exc``, if any."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception, got {exc!r}")
    record = getattr(exc, _RECORD, None)
    return record if isinstance(record, GaveUp) else None


class _Begun:
    """What :meth:`Retry.begin` hands to ``after``/``end`` when the context was marked."""

    __slots__ = ("charged", "limit", "start")

    def __init__(
        self, start: float, charged: Token[Any] | None, limit: Token[Deadline | None] | None
    ) -> None:
        self.start = start
        self.charged = charged
        self.limit = limit


class RetryState:
    """One call's way through its attempts (created at the first failure, never on success).

    ``attempt`` is the number of the attempt that just ended (or is running); ``started`` is
    when the call began, ``attempt_started`` when the current attempt did.
    """

    __slots__ = ("attempt", "attempt_started", "delays", "started")

    def __init__(self, started: float) -> None:
        self.attempt = 1
        self.started = started
        self.attempt_started = started
        self.delays: Iterator[float] | None = None


def _backoff(name: str, value: object) -> Backoff:
    if not isinstance(value, Backoff):
        raise ConfigError(f"{name} must have a delays() method, got {value!r}")
    return value


def _classifier(name: str, value: object) -> Classifier:
    if not isinstance(value, Classifier):
        raise ConfigError(f"{name} must be a floodwall Classifier, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RetryOptions:
    """A :class:`Retry`'s options, validated once (defaults: :mod:`floodwall._core.defaults`).

    ``retry_on`` and ``business`` take exception types or an :class:`~floodwall.Outcomes` and
    are kept as ``Outcomes``; ``backoff=None`` is the default full-jitter exponential backoff.
    The budget is not an option but a shared, stateful object given to :class:`Retry` itself.
    """

    attempts: int = defaults.RETRY_ATTEMPTS
    backoff: Backoff | None = None
    deadline: float | None = None
    retry_on: Outcomes = NOTHING
    retry_on_result: Callable[[Any], bool] | None = None
    business: Outcomes = NOTHING
    classifier: Classifier = DEFAULT_CLASSIFIER
    retry_overload: bool = False
    max_retry_after: float = defaults.RETRY_MAX_RETRY_AFTER
    respect_marker: bool = True
    idempotent: bool = True
    level: int | None = None
    max_level: int = defaults.RETRY_MAX_LEVEL

    CHECKS: ClassVar[Checks] = {
        "attempts": validate.count,
        "backoff": optional(_backoff),
        "deadline": optional(partial(validate.seconds, positive=True)),
        "retry_on": Outcomes.of,
        "retry_on_result": optional(partial(validate.function, what="callable")),
        "business": Outcomes.of,
        "classifier": _classifier,
        "retry_overload": validate.flag,
        "max_retry_after": validate.seconds,
        "respect_marker": validate.flag,
        "idempotent": validate.flag,
        "level": optional(validate.count),
        "max_level": partial(validate.count, minimum=0),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.backoff is None:
            object.__setattr__(self, "backoff", FullJitter())


class Retry(Attempts):
    """Retry failed calls that a retry can fix, within attempts, deadline and budget.

    The rules: [Retries][guide-retries]. Defaults: ``attempts=3`` in total,
    ``backoff=FullJitter(base=0.1, cap=10)``, a private ``RetryBudget(ratio=0.1,
    min_per_second=1)`` (pass ``budget=None`` for none, or a shared one),
    ``max_retry_after=30`` s, ``max_level=2``. ``rng`` feeds the backoff's jitter (unless the
    backoff has its own).
    """

    kind = "retry"

    def __init__(
        self,
        name: str = "retry",
        *,
        attempts: int = defaults.RETRY_ATTEMPTS,
        backoff: Backoff | None = None,
        deadline: float | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes = (),
        retry_on_result: Callable[[Any], bool] | None = None,
        business: type[BaseException] | tuple[type[BaseException], ...] | Outcomes = (),
        classifier: Classifier = DEFAULT_CLASSIFIER,
        retry_overload: bool = False,
        max_retry_after: float = defaults.RETRY_MAX_RETRY_AFTER,
        budget: RetryBudget | None = _DEFAULT_BUDGET,
        respect_marker: bool = True,
        idempotent: bool = True,
        level: int | None = None,
        max_level: int = defaults.RETRY_MAX_LEVEL,
        clock: Clock = SYSTEM_CLOCK,
        rng: Rng | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.name = validate.text("name", name)
        self.options = options = RetryOptions(
            attempts,
            backoff,
            deadline,
            retry_on,  # type: ignore[arg-type]  # normalised to Outcomes by its check
            retry_on_result,
            business,  # type: ignore[arg-type]
            classifier,
            retry_overload,
            max_retry_after,
            respect_marker,
            idempotent,
            level,
            max_level,
        )
        """The options (frozen), read once into the attributes of the same names below."""
        self.attempts = options.attempts
        self.backoff: Backoff = options.backoff  # type: ignore[assignment]  # never None
        self.deadline = options.deadline
        self.retry_on = options.retry_on
        self.retry_on_result = options.retry_on_result
        # `begin` gives a bare start time when it set nothing; then a success stands without
        # `after` (unless results are judged) and `end` has nothing to reset
        self.settled = float if options.retry_on_result is None else None
        self.business = options.business
        self.classifier = options.classifier
        self.retry_overload = options.retry_overload
        self.max_retry_after = options.max_retry_after
        if budget is _DEFAULT_BUDGET:
            budget = RetryBudget(name=f"{name}.budget", clock=clock)
        elif budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigError(f"budget must be a RetryBudget or None, got {budget!r}")
        self.budget: RetryBudget | None = budget
        if budget is not None:
            budget.attach()
        self.respect_marker = options.respect_marker
        self.idempotent = options.idempotent
        self.level = options.level
        self.max_level = options.max_level
        self.clock = clock
        self.rng = rng
        self.listeners = Listeners(listeners)
        self._now = clock.monotonic
        self._enabled = True
        self._disabled_reason = ""
        self._calls = Tally()
        self._retries = Tally()
        self._recovered = Tally()
        self._failed = Tally()
        self._refusals = Tally()

    # -- the decision core ------------------------------------------------------------------

    def decide(
        self, state: RetryState, error: BaseException | None, result: Any, now: float
    ) -> float:
        """After attempt ``state.attempt`` failed at ``now`` (with ``error``, or with a
        ``result`` flagged as failed): the seconds to wait before the next attempt, or a
        negative number to stop.

        Stopping has already annotated ``error`` and emitted the events; retrying has taken a
        retry from the budget and advanced ``state``. Reads the ambient context (marker,
        idempotency key, deadline) but never sleeps.
        """
        attempt = state.attempt
        kind, what, retry_after, why = self._judge(error, result)
        if why is None:
            why = self._refusal(state, error)
        if why is not None:
            return self._stop(state, error, now, why)
        if state.delays is None:
            state.delays = self.backoff.delays(self.rng)
        delay = next(state.delays)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after))
        ambient = _DEADLINE.get()
        if ambient is not None:
            left = ambient.remaining()
            last = now - state.attempt_started
            if delay + last >= left:
                late: tuple[Cause, str] = (
                    "deadline",
                    f"a retry after {delay:.3f}s taking as long as the last attempt "
                    f"({last:.3f}s) would end past the deadline ({left:.3f}s left)",
                )
                return self._stop(state, error, now, late)
        budget = self.budget
        if budget is not None and not budget.try_withdraw(now):
            refused = budget.exhausted(self.name, now)
            return self._stop(state, error, now, ("budget", refused.reason), refused=refused)
        self._retries.add()
        state.attempt = attempt + 1
        if self.listeners:
            self.listeners.emit(
                Event(
                    "retry_scheduled",
                    self.kind,
                    self.name,
                    now,
                    f"{what} ({kind.name.lower()}); attempt {attempt + 1} in {delay:.3f}s",
                    figures={
                        "attempt": attempt + 1,
                        "delay": delay,
                        "error": what,
                        "error_class": kind.name,
                        "retry_after": retry_after,
                    },
                )
            )
        return delay

    def _judge(
        self, error: BaseException | None, result: Any
    ) -> tuple[ErrorClass, str, float | None, tuple[Cause, str] | None]:
        """Classify a failure: ``(class, description, retry_after, why not)``; ``why not`` is
        None when a retry may help."""
        classifier = self.classifier
        if error is not None:
            kind = _BUSINESS if self.business.error(error) else classifier.classify(error)
            if kind is _UNKNOWN and self.retry_on.error(error):
                kind = _TRANSIENT
        else:
            kind = classifier.classify_result(result)
        what = _describe(error, result)
        if kind is _BUSINESS:
            return kind, what, None, ("business", f"{what} is a business error")
        if kind is _UNKNOWN:
            return kind, what, None, ("not_retryable", f"{what} is not a retryable error")
        retry_after = classifier.retry_after(result if error is None else error)
        if kind is _OVERLOAD and (not self.retry_overload or retry_after is None):
            off = "retry_overload is off" if not self.retry_overload else "no retry_after given"
            return kind, what, retry_after, ("overload", f"{what} is an overload signal ({off})")
        return kind, what, retry_after, None

    def _refusal(self, state: RetryState, error: BaseException | None) -> tuple[Cause, str] | None:
        """Why this call must not be retried although its failure is retryable, or None."""
        attempt = state.attempt
        if attempt >= self.attempts:
            return "attempts", f"no attempts left (attempts={self.attempts})"
        if not self._enabled:
            return "disabled", f"retries are disabled: {self._disabled_reason}"
        if self.level is not None and self.level > self.max_level:
            return "level", (
                f"dependency level {self.level} > max_level {self.max_level}: never retried"
            )
        if self.respect_marker:
            marker = _RETRY.get()
            if marker is not None:
                return "marker", (
                    f"{marker.origin!r} above is already retrying (its attempt {marker.attempt})"
                )
            below = None if error is None else gave_up(error)
            if below is not None and below.final:
                return "retried_below", (
                    f"already handled by {below.policy!r} below ({below.cause}, "
                    f"{below.attempts} attempt(s))"
                )
        if not self.idempotent and _IDEMPOTENCY_KEY.get() is None:
            return "idempotency", "idempotent=False and the call carries no idempotency key"
        return None

    def _stop(
        self,
        state: RetryState,
        error: BaseException | None,
        now: float,
        why: tuple[Cause, str],
        *,
        refused: RetryBudgetExhausted | None = None,
    ) -> float:
        cause, reason = why
        attempts = state.attempt
        self._failed.add()
        if refused is not None:
            self._refusals.add()
        if error is not None and (attempts > 1 or cause not in _QUIET):
            error.add_note(
                f"RetryBudgetExhausted: {refused} (retry {self.name!r} gave up after "
                f"{attempts} attempt(s))"
                if refused is not None
                else f"floodwall: retry {self.name!r} gave up after {attempts} attempt(s): {reason}"
            )
            with contextlib.suppress(AttributeError):  # an exception type without __dict__
                setattr(error, _RECORD, GaveUp(self.name, attempts, cause, reason, refused))
        if self.listeners:
            figures: dict[str, Any] = {
                "attempts": attempts,
                "cause": cause,
                "error": _describe(error, None) if error is not None else "failed result",
                "elapsed": now - state.started,
            }
            if refused is not None and self.budget is not None:
                snap = self.budget.snapshot(now)
                self.listeners.emit(
                    Event(
                        "budget_exhausted",
                        self.kind,
                        self.name,
                        now,
                        refused.reason,
                        figures={
                            "requests": snap.requests,
                            "retries": snap.retries,
                            "allowance": snap.allowance,
                            "ratio": snap.ratio,
                        },
                    )
                )
            self.listeners.emit(
                Event("given_up", self.kind, self.name, now, reason, figures=figures)
            )
        return _STOP

    # -- entering a call --------------------------------------------------------------------

    def _own_deadline(self, start: float, seconds: float) -> Token[Deadline | None]:
        """Install ``start + seconds`` (or the ambient deadline, if sooner) for the call."""
        at = start + seconds
        outer = _DEADLINE.get()
        if outer is not None:
            at = min(at, start + outer.remaining())
        return _DEADLINE.set(Deadline(at, self.clock))

    def _attempt_event(self, attempt: int, now: float) -> None:
        self.listeners.emit(
            Event(
                "attempt",
                self.kind,
                self.name,
                now,
                f"attempt {attempt}",
                figures={"attempt": attempt},
            )
        )

    # -- the steps (the drivers run them: begin, the first attempt, after, end) ----------------

    def begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | _Begun:
        """Count the call, deposit into the budget, install the deadline; the call's start time
        (or, when a shared budget or a deadline marked the context, what ``end`` must reset)."""
        start = self._now()
        self._calls.add()
        budget = self.budget
        charged = limit = None
        if budget is not None:
            if budget._users > 1:
                charged = budget.enter(start)  # shared: count a nested request once
            elif not budget._add(start, 0.0, 0):  # private: the lock-free deposit
                budget.deposit(start)
        if self.deadline is not None:
            limit = self._own_deadline(start, self.deadline)
        if self.listeners._items:  # (not `if self.listeners`: its Python __bool__, run per
            self._attempt_event(1, start)  # call, would re-enter the interpreter from C)
        if charged is None and limit is None:
            return start
        return _Begun(start, charged, limit)

    def after(
        self, begun: float | _Begun, error: BaseException | None, result: Any
    ) -> FlowSteps | None:
        """The first attempt ended: ``None`` if it stands, else the steps of the retries."""
        if error is None and (self.retry_on_result is None or not self.retry_on_result(result)):
            return None
        state = RetryState(begun if type(begun) is float else begun.start)  # type: ignore[union-attr]
        delay = self.decide(state, error, result, self._now())
        if delay < 0:
            return None  # stopped: the first attempt's error or failed result stands
        return self._retries_after(state, delay)

    def end(self, begun: float | _Begun) -> None:
        if type(begun) is _Begun:
            if begun.limit is not None:
                _DEADLINE.reset(begun.limit)
            if begun.charged is not None:
                _BUDGETS.reset(begun.charged)

    def _retries_after(self, state: RetryState, delay: float) -> FlowSteps:
        """Sleep ``delay``, attempt again under the retry marker, decide; until done."""
        predicate = self.retry_on_result
        while True:
            if delay > 0:
                yield Sleep(self.clock, delay)
            state.attempt_started = now = self._now()
            if self.listeners:
                self._attempt_event(state.attempt, now)
            token = _RETRY.set(RetryMarker(state.attempt, self.name))
            try:
                result = yield CALL
            except Exception as exc:  # noqa: BLE001 - decide() sorts it; BaseException passes
                error: BaseException | None = exc
                result = None
            else:
                error = None
                if predicate is None or not predicate(result):
                    self._recovered.add()
                    return result
            finally:
                _RETRY.reset(token)
            delay = self.decide(state, error, result, self._now())
            if delay < 0:
                break
        if error is None:
            return result
        try:
            raise error
        finally:
            del error  # no frame -> traceback -> frame cycle

    # -- operators and observers ------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False while :meth:`disable` is in force: every call then makes one attempt."""
        return self._enabled

    def disable(self, reason: str = "disabled by operator") -> None:
        """Stop retrying (one attempt per call) until :meth:`enable`; the switch that
        dependency-level degradation flips."""
        validate.text("reason", reason, error=ValueError)
        self._enabled = False
        self._disabled_reason = reason
        if self.listeners:
            self.listeners.emit(Event("disabled", self.kind, self.name, self._now(), reason))

    def enable(self, reason: str = "enabled by operator") -> None:
        """Retry again after :meth:`disable`."""
        validate.text("reason", reason, error=ValueError)
        self._enabled = True
        self._disabled_reason = ""
        if self.listeners:
            self.listeners.emit(Event("enabled", self.kind, self.name, self._now(), reason))

    @property
    def calls(self) -> int:
        """Calls made through this policy (first attempts)."""
        return self._calls.value

    @property
    def retries(self) -> int:
        """Retries started (attempts after the first)."""
        return self._retries.value

    @property
    def recovered(self) -> int:
        """Calls that failed at first and succeeded on a retry."""
        return self._recovered.value

    @property
    def failed(self) -> int:
        """Calls that ended in failure (after whatever retries were allowed)."""
        return self._failed.value

    @property
    def budget_refusals(self) -> int:
        """Retries the budget refused."""
        return self._refusals.value

    def describe(self) -> str:
        parts = [repr(self.name), f"attempts={self.attempts}", f"backoff={self.backoff!r}"]
        if self.budget is not None:
            parts.append(f"budget={self.budget.name!r}")
        if self.deadline is not None:
            parts.append(f"deadline={self.deadline:g}s")
        if not self.idempotent:
            parts.append("idempotent=False")
        if self.level is not None:
            parts.append(f"level={self.level}")
        return f"Retry({', '.join(parts)})"
