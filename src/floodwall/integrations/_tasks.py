"""The task guard core the Celery, Dramatiq and arq integrations share: no queue library.

A queue shell describes each delivery of a task message as a :class:`Delivery` (task name,
message id, and what floodwall's headers on the message say) and asks :meth:`TaskGuard.run` (or
:meth:`TaskGuard.run_async`) to run the task's function. The answer is :class:`Done` (the
result: acknowledge the message) or :class:`Again` (publish the message again after ``delay``
seconds with ``headers``); a task that will not run again raises its error.

What happens to one delivery, in order:

1. **idempotency** (``idempotency``, an :class:`~floodwall.Idempotency`): the delivery claims its
   key (default: the message id, which a broker keeps across redeliveries and retries; or
   ``key(*args, **kwargs)``). A message redelivered after its task finished (``acks_late`` and a
   worker killed before the ack, a visibility timeout) gets the stored result back and its
   function does not run again; one whose claim another worker holds is deferred until the
   claim would lapse.
2. **admission** (``policy``: a breaker, a global rate limit, a bulkhead, a
   :class:`~floodwall.Pipeline` of them): a refusal (an open breaker, a rate limit, a full
   bulkhead, a shed level, a claim held elsewhere: :data:`DEFERRED_KINDS`, raised by the policy
   or by the task's own calls) **defers** the task: it is not started (or its run ends), and
   comes back after ``retry_after`` (``defer`` when the refusal names none), spread by up to
   ``defer_jitter`` of it, so
   deferred tasks do not return in one burst) — never immediately, never in a tight loop. A
   task deferred for longer than ``max_defer`` seconds in all fails with the refusal.
3. **the function**, under the retry marker the message carries (below).
4. **retries** (``retry``, a :class:`~floodwall.Retry`): a failure is retried only if that
   policy's decision core says so: what failed (business errors and unknown errors are not
   retried), ``attempts`` in all, its backoff (and ``Retry-After``), its
   :class:`~floodwall.RetryBudget` (a task's first delivery deposits, every retry withdraws) and
   the retry marker. The retry is published with ``floodwall-attempt`` one higher; the queue's
   own retry counter is not used.

**Headers on the wire** (message headers in Celery, message options in Dramatiq, a record beside
the job in arq):

==========================  ======================================================================
``floodwall-attempt``        this delivery is attempt *n* (>= 1) of the task: a retry runs under a
                             :class:`~floodwall.RetryMarker` (its own calls do not retry, the
                             ``X-Retry-Attempt`` its HTTP calls send says so downstream)
``floodwall-retry``          ``attempt;origin``: the retry marker of whatever enqueued the task (a
                             retried task, or an HTTP request that was a retry). The task runs
                             under it and is not retried itself: a chain of tasks retries at one
                             layer, not at each (3 × 3 × 3 becomes 3)
``floodwall-deferred``       wall-clock epoch seconds of the task's first deferral
``floodwall-until``          wall-clock epoch seconds before which the delivery must not run: a
                             wait longer than the broker can hold a message is published in
                             steps (Celery on Redis/SQS: under its ``visibility_timeout``), and
                             a delivery that comes back early is held again (:meth:`TaskGuard.
                             run` answers :class:`Again` ``"hold"``: nothing runs, nothing is
                             counted)
==========================  ======================================================================

:func:`outgoing_headers` gives what a message published now must carry (the ambient retry
marker); each shell adds it when a task is enqueued (Celery's ``before_task_publish``,
Dramatiq's ``before_enqueue``, arq's ``enqueue_job`` helper).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, RejectedError
from floodwall._core.policy import Policy
from floodwall._core.tally import Tally, values
from floodwall.context import _IDEMPOTENCY_KEY, _RETRY, RetryMarker, current_retry
from floodwall.pipeline import Pipeline
from floodwall.retry import Retry, RetryState
from floodwall.shared.idempotency import Idempotency

__all__ = [
    "ATTEMPT",
    "DEFERRED",
    "DEFERRED_KINDS",
    "RETRY",
    "UNTIL",
    "Again",
    "Delivery",
    "Done",
    "TaskGuard",
    "outgoing_headers",
]

DEFERRED_KINDS: Final = frozenset(
    {
        "circuit_open",
        "rate_limited",
        "store_unavailable",
        "bulkhead_full",
        "overloaded",
        "degraded",
        "duplicate_in_flight",
        "idempotency_unavailable",
    }
)
"""Refusals that defer a task (it did not run, and will later: an idempotency store that is
down included, rather than run a write it cannot deduplicate, and a global limit whose store is
down with ``fail_closed``); any other error is a failure."""

ATTEMPT: Final = "floodwall-attempt"
RETRY: Final = "floodwall-retry"
DEFERRED: Final = "floodwall-deferred"
UNTIL: Final = "floodwall-until"


def _marker(value: object) -> RetryMarker | None:
    """A retry marker from ``attempt;origin`` (``None`` when absent or malformed)."""
    if not isinstance(value, str | bytes) or not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    attempt, _, origin = text.partition(";")
    try:
        number = int(attempt)
    except ValueError:
        return None
    return RetryMarker(number, origin or "upstream") if number >= 2 else None


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past float
        return None
    return number if math.isfinite(number) and number >= 0 else None  # NaN, inf, < 0: absent


def outgoing_headers() -> dict[str, str]:
    """The headers a task message published now carries: the ambient retry marker, if any."""
    marker = current_retry()
    return {} if marker is None else {RETRY: f"{marker.attempt};{marker.origin}"}


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a task message: ``task`` name, ``message_id`` (stable across
    redeliveries), its ``attempt`` (1 unless it is a retry), the ``inherited`` retry marker of
    whatever enqueued it, when it was first deferred and when it may run (wall clock, or
    ``None``)."""

    task: str
    message_id: str
    attempt: int = 1
    inherited: RetryMarker | None = None
    deferred_since: float | None = None
    until: float | None = None

    @classmethod
    def read(cls, task: str, message_id: str, headers: Mapping[str, Any] | None) -> Delivery:
        """The delivery described by a message's ``headers`` (unknown or malformed values are
        read as absent: a message from an older publisher runs as a first attempt)."""
        headers = headers or {}
        attempt = _number(headers.get(ATTEMPT))
        return cls(
            task,
            message_id,
            int(attempt) if attempt is not None and attempt >= 1 else 1,
            _marker(headers.get(RETRY)),
            _number(headers.get(DEFERRED)),
            _number(headers.get(UNTIL)),
        )

    def headers(
        self, attempt: int, deferred_since: float | None, until: float | None = None
    ) -> dict[str, str]:
        """The floodwall headers of this task's next message (``until``: not before then)."""
        out = {ATTEMPT: str(attempt)}
        inherited = self.inherited
        out[RETRY] = "" if inherited is None else f"{inherited.attempt};{inherited.origin}"
        out[DEFERRED] = "" if deferred_since is None else f"{deferred_since:.3f}"
        out[UNTIL] = "" if until is None else f"{until:.3f}"
        return out


@dataclass(frozen=True, slots=True)
class Done:
    """The task ran (or its stored result was replayed): acknowledge with ``value``."""

    value: Any


@dataclass(frozen=True, slots=True)
class Again:
    """Publish the task again in ``delay`` seconds with ``headers``: a ``"retry"`` of a failure,
    a ``"defer"`` of a refusal, or a ``"hold"`` of a delivery that came back before its
    ``floodwall-until`` (a long wait published in steps); ``error`` is what happened."""

    delay: float
    headers: dict[str, str]
    kind: str
    error: BaseException = field(compare=False)


def _check_seconds(name: str, value: object, *, positive: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        ok = (value > 0 if positive else value >= 0) and value < float("inf")  # type: ignore[operator]
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


class TaskGuard:
    """Run task deliveries under floodwall's policies (see [Task queues][guide-tasks]).

    ``policy``: the admission around each run (breaker, rate limit, bulkhead, a pipeline);
    ``retry``: the :class:`~floodwall.Retry` whose decision core retries failures (``None``:
    failures are not retried); ``idempotency``: runs each key once (``key(*args, **kwargs)``,
    default the message id). ``max_defer``: seconds a task may be deferred in all (default
    3600); ``defer``: the wait after a refusal that names none (a breaker forced open: 5 s);
    ``defer_jitter``: a deferral waits ``retry_after × (1 + U(0, defer_jitter))``
    (default 0.5); ``min_delay``: the shortest deferral (default 0.05 s).
    Thread-safe; one guard may serve many tasks.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        retry: Retry | None = None,
        idempotency: Idempotency | None = None,
        key: Callable[..., str | None] | None = None,
        max_defer: float = defaults.TASK_MAX_DEFER,
        defer: float = defaults.TASK_DEFER,
        defer_jitter: float = defaults.TASK_DEFER_JITTER,
        min_delay: float = defaults.TASK_MIN_DELAY,
        name: str = "tasks",
        clock: Clock = SYSTEM_CLOCK,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigError(f"policy must be a floodwall Policy, got {policy!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigError(f"retry must be a floodwall Retry, got {retry!r}")
        if idempotency is not None and not isinstance(idempotency, Idempotency):
            raise ConfigError(f"idempotency must be a floodwall Idempotency, got {idempotency!r}")
        if key is not None and not callable(key):
            raise ConfigError(f"key must be callable, got {key!r}")
        self.max_defer = _check_seconds("max_defer", max_defer, positive=True)
        self.defer = _check_seconds("defer", defer, positive=True)
        self.defer_jitter = _check_seconds("defer_jitter", defer_jitter, positive=False)
        self.min_delay = _check_seconds("min_delay", min_delay, positive=False)
        self.policy = policy
        self.retry = retry
        self.idempotency = idempotency
        self.key = key
        self.name = name
        self.clock = clock
        self.wall = wall
        self.rng = rng if rng is not None else random.Random()
        stages = [p for p in (idempotency, policy) if p is not None]
        self._run: Policy | None = (
            None if not stages else stages[0] if len(stages) == 1 else Pipeline(*stages)
        )
        self._executions = Tally()
        self._replays = Tally()
        self._deferred = Tally()
        self._retried = Tally()
        self._failed = Tally()

    # -- the decisions -------------------------------------------------------------------------

    def _key(self, delivery: Delivery, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        if self.idempotency is None:
            return None
        if self.key is None:
            return f"{delivery.task}:{delivery.message_id}"
        return self.key(*args, **kwargs)

    def _enter(self, delivery: Delivery, key: str | None) -> tuple[Any, Any]:
        """Set the run's retry marker (its own attempt, else the inherited one) and key."""
        own = delivery.attempt
        marker = RetryMarker(own, delivery.task) if own >= 2 else delivery.inherited
        return _RETRY.set(marker), _IDEMPOTENCY_KEY.set(key)

    @staticmethod
    def _leave(tokens: tuple[Any, Any]) -> None:
        _RETRY.reset(tokens[0])
        _IDEMPOTENCY_KEY.reset(tokens[1])

    def _deposit(self, delivery: Delivery) -> None:
        """A task's first delivery is one request for the retry budget."""
        retry = self.retry
        if retry is None or retry.budget is None:
            return
        if delivery.attempt == 1 and delivery.deferred_since is None:
            retry.budget.deposit(self.clock.monotonic())

    def _after(self, delivery: Delivery, error: Exception) -> Again:
        """A run ended with ``error``: defer a refusal, retry a failure, or raise it."""
        if isinstance(error, RejectedError) and error.kind in DEFERRED_KINDS:
            retry_after = error.retry_after
            return self._defer(delivery, error, self.defer if retry_after is None else retry_after)
        retry = self.retry
        if retry is None:
            self._failed.add()
            raise error
        state = RetryState(self.clock.monotonic())
        state.attempt = delivery.attempt
        token = _RETRY.set(delivery.inherited)  # decide as the task's enqueuer would see it
        try:
            delay = retry.decide(state, error, None, self.clock.monotonic())
        finally:
            _RETRY.reset(token)
        if delay < 0:
            self._failed.add()
            raise error
        self._retried.add()
        headers = delivery.headers(state.attempt, None)
        return Again(max(delay, self.min_delay), headers, "retry", error)

    def _defer(self, delivery: Delivery, error: RejectedError, retry_after: float) -> Again:
        now = self.wall()
        since = delivery.deferred_since if delivery.deferred_since is not None else now
        delay = max(self.min_delay, retry_after * (1.0 + self.rng.uniform(0, self.defer_jitter)))
        if now - since + delay > self.max_defer:
            self._failed.add()
            error.add_note(
                f"floodwall: task {delivery.task!r} deferred since {now - since:.1f}s: "
                f"max_defer={self.max_defer:g}s reached"
            )
            raise error
        self._deferred.add()
        return Again(delay, delivery.headers(delivery.attempt, since), "defer", error)

    def _held(self, delivery: Delivery) -> Again | None:
        """A delivery that came back before its ``until``: publish it again for the rest of
        the wait, running nothing (no claim, no admission, no budget deposit)."""
        until = delivery.until
        if until is None:
            return None
        left = until - self.wall()
        if left <= 0:
            return None
        headers = delivery.headers(delivery.attempt, delivery.deferred_since, until)
        why = f"held until {until:.3f} (a wait longer than the broker holds a message)"
        return Again(left, headers, "hold", RejectedError(delivery.task, why, left))

    def _ran(self, ran: list[bool]) -> None:
        if ran:
            self._executions.add()
        elif self.idempotency is not None:
            self._replays.add()  # the policy answered without running: a stored result

    # -- the two shells ------------------------------------------------------------------------

    def run(
        self,
        delivery: Delivery,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Done | Again:
        """Run one delivery of a sync task: :class:`Done` or :class:`Again`, or raise the
        error the task fails with."""
        held = self._held(delivery)
        if held is not None:
            return held
        kwargs = {} if kwargs is None else kwargs
        tokens = self._enter(delivery, self._key(delivery, args, kwargs))
        ran: list[bool] = []

        def body(*args: Any, **kwargs: Any) -> Any:
            ran.append(True)
            return fn(*args, **kwargs)

        try:
            self._deposit(delivery)
            value = (
                body(*args, **kwargs)
                if self._run is None
                else self._run.call(body, *args, **kwargs)
            )
        except Exception as error:  # noqa: BLE001 - sorted by _after; BaseException passes
            if ran:
                self._executions.add()
            return self._after(delivery, error)
        finally:
            self._leave(tokens)
        self._ran(ran)
        return Done(value)

    async def run_async(
        self,
        delivery: Delivery,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Done | Again:
        """:meth:`run` for a coroutine function."""
        held = self._held(delivery)
        if held is not None:
            return held
        kwargs = {} if kwargs is None else kwargs
        tokens = self._enter(delivery, self._key(delivery, args, kwargs))
        ran: list[bool] = []

        async def body(*args: Any, **kwargs: Any) -> Any:
            ran.append(True)
            return await fn(*args, **kwargs)

        try:
            self._deposit(delivery)
            if self._run is None:
                value = await body(*args, **kwargs)
            else:
                value = await self._run.call_async(body, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - sorted by _after; BaseException passes
            if ran:
                self._executions.add()
            return self._after(delivery, error)
        finally:
            self._leave(tokens)
        self._ran(ran)
        return Done(value)

    def snapshot(self) -> dict[str, int]:
        """Deliveries of this process by what became of them: ``executions`` (the function
        ran), ``replays`` (a stored result answered), ``deferred``, ``retried``, ``failed``."""
        counts = values(
            (self._executions, self._replays, self._deferred, self._retried, self._failed)
        )
        return dict(
            zip(("executions", "replays", "deferred", "retried", "failed"), counts, strict=True)
        )

    def describe(self) -> str:
        parts = [repr(p) for p in (self.idempotency, self.policy, self.retry) if p is not None]
        return f"TaskGuard({self.name!r}: {', '.join(parts) or 'nothing'})"
