"""Celery and Dramatiq with a real Redis broker and real worker processes (issue 21).

The same three scenarios run on each queue, on the test's own Redis (broker and floodwall
store), with four prefork workers: four Celery worker nodes of one process each (four hosts'
worth: Celery keeps ``rate_limit`` per node) and ``dramatiq --processes 4``. Each test prints its
figures beside the queue's own behaviour:

* a global rate limit of 10/s holds across the workers, where a per-worker limit (Celery's
  ``rate_limit="10/s"``; for Dramatiq, which has none, floodwall's in-memory GCRA in each
  process) admits about four times that;
* a dependency down for 10 s: task executions per submitted task with floodwall's retry budget
  (and with the budget and a breaker that defers tasks) against the queue's own retries
  (Celery's ``autoretry_for``, Dramatiq's ``Retries`` middleware), three retries each;
* ``kill -9`` of a worker holding a finished task before its acknowledgement: the redelivered
  task does not repeat its side effect with floodwall's idempotency, and does without it.

arq (asyncio, no prefork) is in ``test_task_queue_arq.py``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import redis

from taskqueues import (
    Workers,
    busiest_second,
    host_store_name,
    limit_figures,
    rate,
    strings,
    throwaway_redis,
    times,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

WORKERS = 4


class Queue(Protocol):
    name: str
    per_worker_limit: str
    """The task limited at 10/s by each worker on its own."""

    def start(self, workers: Workers, name: str, processes: int, threads: int = 1) -> Any: ...

    def send(self, task: str, *args: object) -> None: ...


class CeleryQueue:
    name = "celery"
    per_worker_limit = "limited_celery"

    def __init__(self, url: str, env: dict[str, str]) -> None:
        from celery import Celery

        self.app = Celery("client", broker=url)
        self.env = env

    def start(self, workers: Workers, name: str, processes: int, threads: int = 1) -> Any:
        """``processes`` nodes of one prefork process each (``threads``: pool processes)."""
        procs = []
        for n in range(processes):
            argv = ["celery", "-A", "celery_tasks", "worker", "-P", "prefork", "-c", str(threads)]
            argv += ["-n", f"{name}{n}@%h", "--without-gossip", "--without-mingle"]
            argv += ["--without-heartbeat", "--loglevel", "WARNING"]
            procs.append(workers.start(*argv, name=f"{name}{n}"))
        return procs[0]

    def send(self, task: str, *args: object) -> None:
        self.app.send_task(f"celery_tasks.{task}", args)


class DramatiqQueue:
    name = "dramatiq"
    per_worker_limit = "limited_local"

    def __init__(self, url: str, env: dict[str, str]) -> None:
        from dramatiq.brokers.redis import RedisBroker

        self.broker = RedisBroker(url=url)  # type: ignore[no-untyped-call]
        self.broker.declare_queue("default")
        self.env = env

    def start(self, workers: Workers, name: str, processes: int, threads: int = 1) -> Any:
        """One ``dramatiq`` main process forking ``processes`` workers of ``threads`` each."""
        return workers.start(
            "dramatiq", "dramatiq_tasks", "--processes", str(processes),
            "--threads", str(threads), name=name,
        )  # fmt: skip

    def send(self, task: str, *args: object) -> None:
        from dramatiq import Message

        message: Message[Any] = Message(
            queue_name="default", actor_name=task, args=args, kwargs={}, options={}
        )
        self.broker.enqueue(message)


QUEUES: dict[str, Callable[[str, dict[str, str]], Queue]] = {
    "celery": CeleryQueue,
    "dramatiq": DramatiqQueue,
}
SHORT_REDELIVERY = {"celery": {"FW_VISIBILITY": "2"}, "dramatiq": {"FW_HEARTBEAT": "2000"}}
"""Each broker's wait before a dead worker's unacknowledged messages go back: short here."""


@pytest.fixture
def broker() -> Iterator[tuple[str, redis.Redis]]:
    with throwaway_redis() as pair:
        yield pair


def _ready(queue: Queue, db: redis.Redis, workers: Workers, count: int) -> None:
    """Wait until the workers consume: ``count`` warm-up tasks ran."""
    for i in range(count):
        queue.send("ping", i)
    until(lambda: db.llen("ran:ping") >= count, 60, "the workers to start", workers)


@pytest.mark.parametrize("kind", QUEUES)
def test_a_global_rate_limit_holds_across_four_workers(
    kind: str, broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, db = broker
    queue = QUEUES[kind](url, {})
    count = 40
    names = (queue.per_worker_limit, "limited_floodwall", "limited_host")
    with host_store_name() as host, Workers(url, tmp_path, FW_HOST=host) as workers:
        queue.start(workers, "w", WORKERS)
        _ready(queue, db, workers, 2 * WORKERS)
        for name in names:  # one after the other: each limit has the workers to itself
            for i in range(count):
                queue.send(name, i)

            def ran(key: str = f"ran:{name}") -> bool:
                return bool(db.llen(key) >= count)

            until(ran, 60, name, workers)
    own, ours, host_wide = (times(db, f"ran:{name}") for name in names)
    print(
        f"\n{kind}, {WORKERS} workers, {count} tasks each, limit 10/s:"
        f"\n  per-worker {queue.per_worker_limit:17s} {limit_figures(own)}"
        f"\n  GlobalLimiter on Redis        {limit_figures(ours)}"
        f"\n  GlobalLimiter on host://      {limit_figures(host_wide)}"
    )
    # GCRA at 10/s without burst: one start per 0.1 s on the store's clock, so at most 11 in a
    # closed second; the workers' clocks see each start a little after its admission.
    for stamps in (ours, host_wide):
        assert rate(stamps) <= 10.5
        assert busiest_second(stamps) <= 11
    # Four workers limiting on their own break the bound: up to four times 10 in a second.
    assert busiest_second(own) > 11, "a per-worker limit should break the 10/s bound"


@pytest.mark.parametrize("kind", QUEUES)
def test_a_dependency_outage_causes_no_retry_storm(
    kind: str, broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, db = broker
    queue = QUEUES[kind](url, {})
    variants = ("flaky_naive", "flaky_budget", "flaky_guarded")
    per_second, outage = 10, 10.0
    with Workers(url, tmp_path) as workers:
        queue.start(workers, "w", WORKERS)
        _ready(queue, db, workers, 2 * WORKERS)
        db.set("dependency:down", "1", px=int(outage * 1000))
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < outage:
            for name in variants:
                queue.send(name, sent)
            sent += 1
            time.sleep(max(0.0, started + sent / per_second - time.monotonic()))

        def settled() -> bool:
            return all(
                db.llen(f"done:{name}") + db.llen(f"failed:{name}") >= sent for name in variants
            )

        until(
            settled,
            90,
            "every task to succeed or fail for good",
            workers,
            lambda: {
                name: (db.llen(f"done:{name}"), db.llen(f"failed:{name}"), db.llen(f"ran:{name}"))
                for name in variants
            },
        )
    figures = {}
    print(f"\n{kind}, {WORKERS} workers, a dependency down for {outage:g} s:")
    for name in variants:
        runs, done = db.llen(f"ran:{name}"), db.llen(f"done:{name}")
        figures[name] = runs / sent
        print(
            f"  {name:14s} {sent} tasks: {runs / sent:.2f} executions per task, "
            f"{done} succeeded, {sent - done} failed, {db.llen(f'again:{name}')} re-published"
        )
    assert figures["flaky_budget"] <= 1.2
    assert figures["flaky_guarded"] <= 1.2
    assert figures["flaky_naive"] > figures["flaky_budget"]
    # The breaker's refusals deferred tasks by at least their retry_after: none came back early.
    for line in strings(db, "again:flaky_guarded"):
        delay, retry_after = line.split()
        if retry_after != "None":
            assert float(delay) >= float(retry_after)
    # A deferred task is not lost: every task that failed for good had an execution fail (its
    # retry refused by the budget); the deferred ones ran once the dependency was back.
    done, runs = db.llen("done:flaky_guarded"), db.llen("ran:flaky_guarded")
    assert sent - done <= runs - done
    assert done > db.llen("done:flaky_budget"), "deferred, not refused: more tasks complete"


@pytest.mark.parametrize("kind", QUEUES)
def test_a_redelivered_task_does_not_repeat_its_side_effect(
    kind: str, broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, db = broker
    queue = QUEUES[kind](url, {})
    with Workers(url, tmp_path, **SHORT_REDELIVERY[kind]) as workers:
        db.set("hold", "1")
        doomed = queue.start(workers, "doomed", 1, threads=2)
        queue.send("charge_naive", "order-1")
        queue.send("charge_guarded", "order-2")
        until(lambda: db.llen("holding") >= 2, 60, "both tasks to finish and hold", workers)
        workers.kill(doomed, signal.SIGKILL)  # the worker and its children, before any ack
        db.delete("hold")
        queue.start(workers, "survivor", 1)

        def redelivered() -> bool:
            return db.llen("done:charge_naive") >= 2 and db.llen("done:charge_guarded") >= 2

        until(redelivered, 60, "both messages to be redelivered and finish", workers)
    naive = strings(db, "effects:charge_naive")
    guarded = strings(db, "effects:charge_guarded")
    print(
        f"\n{kind}: kill -9 before the acknowledgement, then redelivery:"
        f"\n  plain task:                side effect ran {len(naive)} times"
        f"\n  floodwall idempotent task: side effect ran {len(guarded)} time(s), "
        f"{db.llen('done:charge_guarded')} deliveries finished"
    )
    assert naive == ["order-1", "order-1"]
    assert guarded == ["order-2"]


def test_celery_a_deferral_longer_than_the_visibility_timeout_runs_once(
    broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    """QA: a deferral is re-published with a countdown, held in the worker's memory until
    due; with the Redis broker a message unacknowledged past ``visibility_timeout`` is
    delivered again, so a refusal whose ``retry_after`` (8 s here) outlasts it (2 s) ran the
    task twice. The wait now goes in steps under half the visibility timeout, held again
    until due: each task runs once, and no countdown exceeds the cap."""
    url, db = broker
    queue = CeleryQueue(url, {})
    visibility = 2.0
    with Workers(url, tmp_path, FW_VISIBILITY=str(visibility)) as workers:
        queue.start(workers, "w", 2)
        _ready(queue, db, workers, 2)
        queue.send("slow_limited", "o-1")  # takes the one permit of the next 8 s
        queue.send("slow_limited", "o-2")  # refused: retry_after about 8 s
        until(lambda: db.llen("effects:slow_limited") >= 2, 60, "both tasks to run", workers)
        time.sleep(8 + 2 * visibility)  # a redelivered copy, deferred 8 s in turn, would run
    effects = strings(db, "effects:slow_limited")
    countdowns = [float(entry.split()[0]) for entry in strings(db, "again:slow_limited")]
    print(
        f"\ncelery, visibility_timeout {visibility:g} s, a deferral of about 8 s: "
        f"side effects {effects}, countdowns {countdowns}"
    )
    assert sorted(effects) == ["o-1", "o-2"]  # each once: no redelivered copy ran
    assert countdowns and max(countdowns) <= visibility / 2
    assert len(countdowns) >= 4  # the 8 s went in steps of at most 1 s
