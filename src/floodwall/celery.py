"""Celery tasks under floodwall's policies: a task base class and the headers on the wire.

::

    from celery import Celery
    import floodwall as fw
    from floodwall.celery import GuardedTask, TaskGuard
    from floodwall.shared import GlobalLimiter

    guard = TaskGuard(
        fw.Pipeline(GlobalLimiter("gcra", "10/s", store=REDIS, max_wait=1.0),
                    fw.CircuitBreaker("payments")),
        retry=fw.Retry("charge", attempts=4),
        idempotency=fw.Idempotency(REDIS),
    )

    @app.task(base=GuardedTask, guard=guard, acks_late=True)
    def charge(order_id: str) -> dict: ...

Each delivery runs through :class:`TaskGuard` (see :mod:`floodwall.integrations._tasks`): a
refusal (open breaker, rate limit, claim held elsewhere) is re-published with
``countdown=retry_after`` instead of running; a failure is retried only when the guard's
:class:`~floodwall.Retry` grants it (attempts, backoff, budget, retry marker); a redelivered
message whose task already finished replays its stored result. Re-publishing goes through
Celery's own ``Task.retry`` (the same task id, so the message id stays the idempotency key), with
floodwall's headers; Celery's ``max_retries`` is off (``None``) for these tasks because floodwall
counts attempts itself and a deferral is not an attempt.

**Long waits and the visibility timeout.** A task re-published with a countdown is fetched at once
and held in the worker's memory until it is due; on Redis and SQS a message unacknowledged for
longer than the broker's ``visibility_timeout`` (``broker_transport_options``; kombu's default
3600 s on Redis, 1800 s on SQS) is delivered again, so a longer countdown would run the task
twice. A wait longer than half the visibility timeout (:func:`hold_limit`) is therefore
published in steps: the countdown is capped and the message carries when it may run
(``floodwall-until``); a step that comes back early is held again without running anything
(no admission, no claim, no attempt used) until the whole wait is over. Other brokers (AMQP)
are not capped (RabbitMQ's own ``consumer_timeout``, 30 minutes by default, bounds how long a
worker may hold a message: keep ``max_defer`` and retry backoffs below it).

Every message published while a retry marker is ambient (inside a retried task, or an HTTP
request that arrived as a retry) carries it (``floodwall-retry``; a ``before_task_publish``
handler connected on import), so the tasks it enqueues do not retry again.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from floodwall._core import defaults
from floodwall._core.errors import ConfigError
from floodwall._core.extras import missing_extra

try:
    from celery import Task
    from celery.signals import before_task_publish
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.celery", "celery") from _missing

from floodwall.integrations._tasks import (
    ATTEMPT,
    DEFERRED,
    RETRY,
    UNTIL,
    Again,
    Delivery,
    Done,
    TaskGuard,
    outgoing_headers,
)

__all__ = ["ATTEMPT", "DEFERRED", "RETRY", "UNTIL", "GuardedTask", "TaskGuard", "hold_limit"]

_log = logging.getLogger("floodwall.celery")


def hold_limit(app: Any) -> float | None:
    """The longest countdown a guarded task of ``app`` is re-published with: half its broker's
    ``visibility_timeout`` (the app's ``broker_transport_options``, else kombu's default for
    Redis and SQS), or ``None`` for a broker without one (AMQP: no cap)."""
    options = app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout")
    if timeout is None:
        url = app.conf.broker_url
        scheme = url.partition("://")[0].lower() if isinstance(url, str) else ""
        timeout = defaults.TASK_VISIBILITY_TIMEOUTS.get(scheme.partition("+")[0])
    if timeout is None:
        return None
    return float(timeout) * defaults.TASK_HOLD_SHARE


class GuardedTask(Task):  # type: ignore[misc] # celery ships no type information
    """A Celery task base class whose deliveries run through ``guard`` (a :class:`TaskGuard`,
    given as ``@app.task(base=GuardedTask, guard=...)``); without a guard it is a plain task.
    Called directly (``task(...)``, not through a worker) it runs the function unguarded; run
    eagerly (``task_always_eager``, ``apply()``) it is guarded, but a deferral or retry raises
    its error instead (Celery would run an eager retry at once, ignoring the countdown).
    A ``guard`` that is not a :class:`TaskGuard`, or ``autoretry_for`` beside a guard, is
    refused (:class:`ConfigError`) when Celery builds the task."""

    guard: ClassVar[TaskGuard | None] = None
    max_retries = None  # floodwall counts attempts; a deferral must not use one up

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check a task's options when Celery builds its class (``@app.task(...)``)."""
        super().__init_subclass__(**kwargs)
        guard = cls.__dict__.get("guard")
        if guard is None:
            return
        if not isinstance(guard, TaskGuard):
            raise ConfigError(f"guard must be a TaskGuard, got {guard!r}")
        if getattr(cls, "autoretry_for", ()):
            raise ConfigError(
                f"task {cls.__dict__.get('name', cls.__name__)!r}: autoretry_for="
                f"{cls.autoretry_for!r} on a GuardedTask would retry every failure without "
                "bound (max_retries is off for guarded tasks); retry with the guard's "
                "Retry(...) instead"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.guard
        request = self.request
        if guard is None or request.called_directly:
            return super().__call__(*args, **kwargs)
        headers = request.headers if isinstance(request.headers, dict) else None
        delivery = Delivery.read(self.name, str(request.id), headers)
        outcome = guard.run(delivery, super().__call__, args, kwargs)
        if isinstance(outcome, Done):
            return outcome.value
        if request.is_eager:  # an eager retry runs at once, countdown ignored: no loop here
            raise outcome.error
        return self._again(outcome)

    def _again(self, again: Again) -> Any:
        headers = dict(self.request.headers or {})
        headers.update(again.headers)
        countdown = again.delay
        cap = hold_limit(self.app)
        if cap is not None and countdown > cap:  # in steps: see "Long waits" above
            if not headers.get(UNTIL):
                assert self.guard is not None
                headers[UNTIL] = f"{self.guard.wall() + countdown:.3f}"
                _log.info(
                    "task %s: a %.1fs wait published in steps of %.1fs (half the broker's "
                    "visibility_timeout)",
                    self.name,
                    countdown,
                    cap,
                )
            countdown = cap
        raise self.retry(countdown=countdown, headers=headers, exc=again.error)


def _carry_marker(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Every published task carries the ambient retry marker (a retry's own re-publication
    already has its headers set)."""
    if headers is None:
        return
    for name, value in outgoing_headers().items():
        headers.setdefault(name, value)


before_task_publish.connect(_carry_marker, weak=False)
