"""Dramatiq actors under floodwall's policies: an actor decorator and a broker middleware.

::

    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from floodwall.dramatiq import FloodwallMiddleware, TaskGuard, actor

    broker = RedisBroker(url=REDIS)
    broker.add_middleware(FloodwallMiddleware())
    dramatiq.set_broker(broker)

    @actor(guard=TaskGuard(fw.CircuitBreaker("payments"), retry=fw.Retry("charge")))
    def charge(order_id: str) -> None: ...

Each message runs through :class:`TaskGuard` (see :mod:`floodwall.integrations._tasks`): a
refusal (open breaker, rate limit, claim held elsewhere) is re-enqueued after ``retry_after``
instead of running; a failure is retried only when the guard's :class:`~floodwall.Retry` grants
it; a redelivered message whose actor already finished replays its stored result. Both go
through Dramatiq's own ``Retries`` middleware (``raise dramatiq.Retry(delay=...)``, the same
message id), with floodwall's headers in the message's ``options["floodwall"]``;
:func:`actor` sets ``retry_when`` so that only floodwall's decisions retry (Dramatiq's
``max_retries`` would count deferrals, and its default retries twenty times). The actor's other
options are Dramatiq's.

:class:`FloodwallMiddleware` (a ``CurrentMessage`` middleware, which the guarded actors need)
adds the ambient retry marker to every message enqueued inside a retried actor (or an HTTP
request that arrived as a retry), so the actors it enqueues do not retry again.

Actors are sync functions (Dramatiq runs them in worker threads).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Final, TypeVar

from floodwall._core.errors import ConfigError
from floodwall._core.extras import missing_extra

try:
    import dramatiq
    from dramatiq.middleware import CurrentMessage
except ModuleNotFoundError as _missing:  # the extra is not installed
    raise missing_extra(_missing, "floodwall.dramatiq", "dramatiq") from _missing

from floodwall.integrations._tasks import Delivery, Done, TaskGuard, outgoing_headers

__all__ = ["OPTION", "FloodwallMiddleware", "TaskGuard", "actor", "only_floodwall_retries"]

F = TypeVar("F", bound=Callable[..., Any])

OPTION: Final = "floodwall"
"""The message option that holds floodwall's headers."""


def only_floodwall_retries(retries: int, exception: BaseException) -> bool:
    """Dramatiq's ``retry_when`` for guarded actors: retry what floodwall decided to retry
    (deferrals and granted retries), nothing else."""
    return isinstance(exception, dramatiq.Retry)


class FloodwallMiddleware(CurrentMessage):
    """Tracks the message being processed (as ``CurrentMessage`` does) and puts the ambient
    retry marker on every new message enqueued."""

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        if OPTION not in message.options:
            headers = outgoing_headers()
            if headers:
                message.options[OPTION] = headers


def _guarded(guard: TaskGuard, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        message = CurrentMessage.get_current_message()
        if message is None:  # called directly, not by a worker
            return fn(*args, **kwargs)
        options = message.options
        delivery = Delivery.read(message.actor_name, message.message_id, options.get(OPTION))
        outcome = guard.run(delivery, fn, args, kwargs)
        if isinstance(outcome, Done):
            return outcome.value
        options[OPTION] = {**(options.get(OPTION) or {}), **outcome.headers}
        delay = max(1, math.ceil(outcome.delay * 1000))  # milliseconds, never early
        raise dramatiq.Retry(str(outcome.error), delay=delay) from outcome.error

    return run


def _check_middleware(broker: Any, name: str) -> None:
    """Refuse a guarded actor on a broker without :class:`FloodwallMiddleware`: the actor
    would find no current message and run every delivery unguarded, silently."""
    if not any(isinstance(m, FloodwallMiddleware) for m in broker.middleware):
        raise ConfigError(
            f"guarded actor {name!r} needs FloodwallMiddleware on the broker, got a "
            f"{type(broker).__name__} without it (its deliveries would run unguarded): call "
            "broker.add_middleware(FloodwallMiddleware()) before declaring guarded actors"
        )


def actor(fn: Callable[..., Any] | None = None, *, guard: TaskGuard, **options: Any) -> Any:
    """``dramatiq.actor`` whose messages run through ``guard``; ``options`` are Dramatiq's
    (``actor_name``, ``queue_name``, ``priority``, ``broker``, ``time_limit`` …). Usable bare
    (``@actor(guard=g)``) or on a function (``actor(fn, guard=g)``). The broker must have
    :class:`FloodwallMiddleware` when the actor is declared (:class:`ConfigError` otherwise)."""
    if not isinstance(guard, TaskGuard):
        raise TypeError(f"guard must be a TaskGuard, got {guard!r}")
    options.setdefault("retry_when", only_floodwall_retries)

    def decorate(fn: Callable[..., Any]) -> Any:
        options.setdefault("actor_name", fn.__name__)
        _check_middleware(options.get("broker") or dramatiq.get_broker(), options["actor_name"])
        return dramatiq.actor(_guarded(guard, fn), **options)

    return decorate if fn is None else decorate(fn)
