"""The arq app the task-queue tests start real workers on (``arq arq_tasks.WorkerSettings``).

Configured by the environment: ``FW_REDIS`` (queue and floodwall store) and
``FW_JOB_TIMEOUT`` (seconds; arq runs a job again ``job_timeout`` + 10 s after its worker died,
so the redelivery test makes it short). Records in Redis as ``celery_tasks`` does; final
outcomes are arq's own job results.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar

import redis
from arq import Retry
from arq.connections import RedisSettings
from arq.worker import func as arq_func

import floodwall as fw
from floodwall.arq import TaskGuard, func
from floodwall.ratelimit import GCRA
from floodwall.shared import GlobalLimiter

REDIS = os.environ["FW_REDIS"]
JOB_TIMEOUT = float(os.environ.get("FW_JOB_TIMEOUT", "60"))
HOST = os.environ.get("FW_HOST", "fw-tasks")
DEPENDENCY_DOWN = "dependency:down"
HOLD = "hold"

db = redis.Redis.from_url(REDIS)


def _ran(task: str) -> None:
    db.rpush(f"ran:{task}", repr(time.time()))


def _dependency(task: str) -> None:
    _ran(task)
    if db.exists(DEPENDENCY_DOWN):
        raise ConnectionError("the dependency is down")


async def ping(ctx: dict[str, Any], i: int) -> None:
    _ran("ping")


def recording(name: str) -> Any:
    async def limited(ctx: dict[str, Any], i: int) -> None:
        _ran(name)

    return limited


async def flaky_naive(ctx: dict[str, Any], i: int) -> None:
    """arq retries nothing by itself: the documented pattern, ``Retry(defer=...)`` by hand,
    three retries after 1, 2 and 4 s."""
    try:
        _dependency("flaky_naive")
    except ConnectionError:
        tries = int(ctx["job_try"])
        if tries <= 3:
            raise Retry(defer=2 ** (tries - 1)) from None
        raise


def flaky(name: str) -> Any:
    async def run(ctx: dict[str, Any], i: int) -> None:
        _dependency(name)

    return run


def charge(name: str) -> Any:
    async def run(ctx: dict[str, Any], order: str) -> str:
        _ran(name)
        db.rpush(f"effects:{name}", order)
        return order

    return run


def _retry(name: str) -> fw.Retry:
    return fw.Retry(
        name,
        attempts=4,
        backoff=fw.backoff.FullJitter(base=1.0, cap=8.0),
        budget=fw.RetryBudget(0.1, min_per_second=0.1),  # 0.1/s per worker: 0.4/s for four
    )


breaker = fw.CircuitBreaker(
    "dependency",
    failure_rate=0.5,
    minimum_calls=2,
    open_duration=1.0,
    open_duration_growth=2.0,
    max_open_duration=4.0,
)


async def _hold(ctx: dict[str, Any]) -> None:
    """A finished job holds its worker before arq records it done (the kill -9 test)."""
    if db.exists(HOLD):
        db.rpush("holding", str(ctx["job_id"]))
        await asyncio.sleep(60)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [
        arq_func(ping, name="ping"),
        func(
            recording("limited_floodwall"),
            name="limited_floodwall",
            guard=TaskGuard(GlobalLimiter("gcra", "10/s", burst=0, store=REDIS, max_wait=2.0)),
        ),
        func(
            recording("limited_host"),
            name="limited_host",
            guard=TaskGuard(
                GlobalLimiter(
                    "gcra", "10/s", burst=0, store=f"host://{HOST}", name="host", max_wait=2.0
                )
            ),
        ),
        func(
            recording("limited_local"),
            name="limited_local",
            guard=TaskGuard(GCRA("10/s", burst=0, max_wait=2.0)),
        ),
        arq_func(flaky_naive, name="flaky_naive"),
        func(flaky("flaky_budget"), name="flaky_budget", guard=TaskGuard(retry=_retry("flaky"))),
        func(
            flaky("flaky_guarded"),
            name="flaky_guarded",
            guard=TaskGuard(breaker, retry=_retry("guarded")),
        ),
        arq_func(charge("charge_naive"), name="charge_naive"),
        func(
            charge("charge_guarded"),
            name="charge_guarded",
            guard=TaskGuard(idempotency=fw.Idempotency(REDIS, lock_ttl=30.0)),
        ),
    ]
    redis_settings = RedisSettings.from_dsn(REDIS)
    max_jobs = 10
    job_timeout = JOB_TIMEOUT
    keep_result = 3600
    poll_delay = 0.05
    on_job_end = _hold
