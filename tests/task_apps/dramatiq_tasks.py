"""The Dramatiq app the task-queue tests start real workers on (``dramatiq dramatiq_tasks``).

Configured by the environment: ``FW_REDIS`` (broker and floodwall store) and ``FW_HEARTBEAT``
(milliseconds without a heartbeat before a worker's unacknowledged messages are requeued,
short in the redelivery test). Records in Redis as ``celery_tasks`` does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.middleware import Middleware, Retries

import floodwall as fw
from floodwall.dramatiq import FloodwallMiddleware, TaskGuard, actor
from floodwall.ratelimit import GCRA
from floodwall.shared import GlobalLimiter

REDIS = os.environ["FW_REDIS"]
HEARTBEAT = int(os.environ.get("FW_HEARTBEAT", "60000"))
HOST = os.environ.get("FW_HOST", "fw-tasks")
DEPENDENCY_DOWN = "dependency:down"
HOLD = "hold"

db = redis.Redis.from_url(REDIS)


class Outcomes(Middleware):
    """What became of each delivery, for the test; holds a finished message before its ack
    while the ``hold`` key exists."""

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        name = message.actor_name
        if exception is None:
            db.rpush(f"done:{name}", "1")
            if db.exists(HOLD):
                db.rpush("holding", message.message_id)
                time.sleep(60)
        elif isinstance(exception, dramatiq.Retry):
            cause = getattr(exception.__cause__, "retry_after", None)
            db.rpush(f"again:{name}", f"{(exception.delay or 0) / 1000!r} {cause!r}")
        elif message.failed:
            db.rpush(f"failed:{name}", "1")
        else:
            db.rpush(f"again:{name}", "None None")


broker = RedisBroker(  # type: ignore[no-untyped-call]
    url=REDIS, heartbeat_timeout=HEARTBEAT, maintenance_chance=MAINTENANCE_SCALE
)
broker.add_middleware(FloodwallMiddleware())
broker.add_middleware(Outcomes(), before=Retries)  # after_* hooks run in reverse: after it
dramatiq.set_broker(broker)


def _ran(task: str) -> None:
    db.rpush(f"ran:{task}", repr(time.time()))


def _dependency(task: str) -> None:
    _ran(task)
    if db.exists(DEPENDENCY_DOWN):
        raise ConnectionError("the dependency is down")


# -- a global rate limit beside a per-process one ----------------------------------------------


@actor(guard=TaskGuard(GlobalLimiter("gcra", "10/s", burst=0, store=REDIS, max_wait=2.0)))
def limited_floodwall(i: int) -> None:
    _ran("limited_floodwall")


@actor(
    guard=TaskGuard(
        GlobalLimiter("gcra", "10/s", burst=0, store=f"host://{HOST}", name="host", max_wait=2.0)
    )
)
def limited_host(i: int) -> None:
    _ran("limited_host")


@actor(guard=TaskGuard(GCRA("10/s", burst=0, max_wait=2.0)))
def limited_local(i: int) -> None:
    _ran("limited_local")


# -- a dependency outage: Dramatiq's Retries, floodwall's budget, budget + breaker -------------


@dramatiq.actor(max_retries=3, min_backoff=1000, max_backoff=8000)
def flaky_naive(i: int) -> None:
    _dependency("flaky_naive")


def _retry(name: str) -> fw.Retry:
    return fw.Retry(
        name,
        attempts=4,
        backoff=fw.backoff.FullJitter(base=1.0, cap=8.0),
        budget=fw.RetryBudget(0.1, min_per_second=0.1),  # 0.1/s per worker: 0.4/s for four
    )


@actor(guard=TaskGuard(retry=_retry("flaky")))
def flaky_budget(i: int) -> None:
    _dependency("flaky_budget")


breaker = fw.CircuitBreaker(
    "dependency",
    failure_rate=0.5,
    minimum_calls=2,
    open_duration=1.0,
    open_duration_growth=2.0,
    max_open_duration=4.0,
)


@actor(guard=TaskGuard(breaker, retry=_retry("flaky-guarded")))
def flaky_guarded(i: int) -> None:
    _dependency("flaky_guarded")


# -- redelivery after kill -9 ---------------------------------------------------------------------


@dramatiq.actor(max_retries=0)
def charge_naive(order: str) -> None:
    _ran("charge_naive")
    db.rpush("effects:charge_naive", order)


@actor(guard=TaskGuard(idempotency=fw.Idempotency(REDIS, lock_ttl=30.0)))
def charge_guarded(order: str) -> str:
    _ran("charge_guarded")
    db.rpush("effects:charge_guarded", order)
    return order


@dramatiq.actor(max_retries=0)
def ping(i: int) -> None:
    _ran("ping")
