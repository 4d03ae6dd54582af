"""The Celery app the task-queue tests start real workers on (``celery -A celery_tasks worker``).

Configured by the environment the test gives the workers: ``FW_REDIS`` (the test's throwaway
Redis: broker and floodwall store alike) and ``FW_VISIBILITY`` (the broker's visibility
timeout, short in the redelivery test). Each task records what it did in Redis, where the test
reads it: ``ran:<task>`` (wall-clock start of every execution), ``done:<task>`` and
``failed:<task>`` (final outcomes), ``effects:<task>`` (side effects, one per execution).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_failure, task_retry, task_success

import floodwall as fw
from floodwall.celery import GuardedTask, TaskGuard
from floodwall.shared import GlobalLimiter

REDIS = os.environ["FW_REDIS"]
VISIBILITY = float(os.environ.get("FW_VISIBILITY", "3600"))
HOST = os.environ.get("FW_HOST", "fw-tasks")
"""The ``host://`` store's name: the test's own, removed when its workers are gone."""
DEPENDENCY_DOWN = "dependency:down"
"""While this key exists the dependency fails (the test sets it with an expiry: the outage)."""
HOLD = "hold"
"""While this key exists a finished task holds its worker before the ack (the kill -9 test)."""

app = Celery("celery_tasks", broker=REDIS)
app.conf.update(
    broker_transport_options={
        "visibility_timeout": VISIBILITY,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
)
db = redis.Redis.from_url(REDIS)


def _ran(task: str) -> None:
    db.rpush(f"ran:{task}", repr(time.time()))


def _dependency(task: str) -> str:
    _ran(task)
    if db.exists(DEPENDENCY_DOWN):
        raise ConnectionError("the dependency is down")
    return "ok"


# -- a global rate limit beside Celery's own per-worker one ----------------------------------

limit_guard = TaskGuard(
    GlobalLimiter("gcra", "10/s", burst=0, store=REDIS, name="tasks-10ps", max_wait=2.0),
)


@app.task(base=GuardedTask, guard=limit_guard)
def limited_floodwall(i: int) -> int:
    _ran("limited_floodwall")
    return i


host_guard = TaskGuard(
    GlobalLimiter("gcra", "10/s", burst=0, store=f"host://{HOST}", name="tasks-10ps", max_wait=2.0)
)


@app.task(base=GuardedTask, guard=host_guard)
def limited_host(i: int) -> int:
    _ran("limited_host")
    return i


@app.task(rate_limit="10/s")
def limited_celery(i: int) -> int:
    _ran("limited_celery")
    return i


# -- a dependency outage: Celery's autoretry_for, floodwall's budget, budget + breaker ------


@app.task(bind=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=3)
def flaky_naive(self: Any, i: int) -> str:
    return _dependency("flaky_naive")


budget_guard = TaskGuard(
    retry=fw.Retry(
        "flaky",
        attempts=4,
        backoff=fw.backoff.FullJitter(base=1.0, cap=8.0),
        budget=fw.RetryBudget(0.1, min_per_second=0.1),  # 0.1/s per worker: 0.4/s for four
    ),
)


@app.task(base=GuardedTask, guard=budget_guard)
def flaky_budget(i: int) -> str:
    return _dependency("flaky_budget")


breaker_guard = TaskGuard(
    fw.CircuitBreaker(
        "dependency",
        failure_rate=0.5,
        minimum_calls=2,
        open_duration=1.0,
        open_duration_growth=2.0,
        max_open_duration=4.0,
    ),
    retry=fw.Retry(
        "flaky-guarded",
        attempts=4,
        backoff=fw.backoff.FullJitter(base=1.0, cap=8.0),
        budget=fw.RetryBudget(0.1, min_per_second=0.1),
    ),
)


@app.task(base=GuardedTask, guard=breaker_guard)
def flaky_guarded(i: int) -> str:
    return _dependency("flaky_guarded")


# -- acks_late redelivery after kill -9 --------------------------------------------------------


@app.task(acks_late=True)
def charge_naive(order: str) -> str:
    _ran("charge_naive")
    db.rpush("effects:charge_naive", order)
    return order


charge_guard = TaskGuard(idempotency=fw.Idempotency(REDIS, lock_ttl=30.0))


@app.task(base=GuardedTask, guard=charge_guard, acks_late=True)
def charge_guarded(order: str) -> str:
    _ran("charge_guarded")
    db.rpush("effects:charge_guarded", order)
    return order


# -- a deferral longer than the broker's visibility timeout ----------------------------------

slow_guard = TaskGuard(
    GlobalLimiter("gcra", "1/8s", burst=0, store=REDIS, name="tasks-1per8s"), defer_jitter=0.0
)


@app.task(base=GuardedTask, guard=slow_guard)
def slow_limited(order: str) -> str:
    _ran("slow_limited")
    db.rpush("effects:slow_limited", order)
    return order


# -- outcomes, for the test ---------------------------------------------------------------------


@task_success.connect
def _succeeded(sender: Any = None, **_: Any) -> None:
    db.rpush(f"done:{sender.name.rpartition('.')[2]}", "1")
    if db.exists(HOLD):  # finished, not yet acknowledged: the moment a crash redelivers
        db.rpush("holding", sender.request.id)
        time.sleep(60)


@task_failure.connect
def _failed(sender: Any = None, **_: Any) -> None:
    db.rpush(f"failed:{sender.name.rpartition('.')[2]}", "1")


@task_retry.connect
def _again(sender: Any = None, reason: Any = None, **_: Any) -> None:
    """Every re-publication: its countdown and the refusal's retry_after (deferrals)."""
    error = getattr(reason, "exc", None)
    retry_after = getattr(error, "retry_after", None)
    when = getattr(reason, "when", None)
    db.rpush(f"again:{sender.name.rpartition('.')[2]}", f"{when!r} {retry_after!r}")


@app.task
def ping(i: int) -> int:
    _ran("ping")
    return i
