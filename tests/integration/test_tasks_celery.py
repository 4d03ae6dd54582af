"""Celery with a real Redis broker and real prefork workers (issue 21).

Four worker nodes (``celery worker -P prefork -c 1``: four hosts' worth of workers) on the test's
own Redis. Each test prints its figures beside Celery's own behaviour:

* a global rate limit of 10/s holds across the workers, where Celery's ``rate_limit="10/s"``,
  kept by each worker node, admits about four times that;
* a dependency down for 10 s: task executions per submitted task with floodwall's retry budget
  (and with the budget and a breaker that defers tasks) against ``autoretry_for``;
* ``kill -9`` of a worker holding a finished ``acks_late`` task before its ack: the redelivered
  task does not repeat its side effect with floodwall's idempotency, and does without it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from taskqueues import Workers, busiest_second, rate, strings, throwaway_redis, times, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NODES = 4


@pytest.fixture
def broker() -> Iterator[tuple[str, redis.Redis]]:
    with throwaway_redis() as pair:
        yield pair


def _celery(workers: Workers, name: str, concurrency: int = 1) -> None:
    workers.start(
        "celery", "-A", "celery_tasks", "worker", "-P", "prefork", "-c", str(concurrency),
        "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel", "WARNING", name=name,
    )  # fmt: skip


class _Client:
    """Sends tasks by name on the test's broker (the test process never imports the app)."""

    def __init__(self, url: str) -> None:
        from celery import Celery

        self.app = Celery("client", broker=url)

    def send(self, task: str, *args: object) -> None:
        self.app.send_task(f"celery_tasks.{task}", args)


def _nodes_up(db: redis.Redis, workers: Workers, count: int) -> None:
    """Wait until ``count`` worker nodes consume (one task each of a warm-up round)."""
    tasks = _Client(workers.env["FW_REDIS"])
    for i in range(count * 2):
        tasks.send("limited_celery", -i)
    until(lambda: db.llen("ran:limited_celery") >= count * 2, 60, "the workers to start", workers)
    db.delete("ran:limited_celery", "done:limited_celery")


def test_celery_a_global_rate_limit_holds_across_four_workers(
    broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, db = broker
    tasks = _Client(url)
    with Workers(url, tmp_path) as workers:
        for n in range(NODES):
            _celery(workers, f"w{n}")
        _nodes_up(db, workers, NODES)
        count = 40
        for i in range(count):
            tasks.send("limited_celery", i)
        until(lambda: db.llen("ran:limited_celery") >= count, 30, "Celery's limited tasks", workers)
        for i in range(count):
            tasks.send("limited_floodwall", i)
        until(lambda: db.llen("ran:limited_floodwall") >= count, 60, "floodwall's tasks", workers)
    own, ours = times(db, "ran:limited_celery"), times(db, "ran:limited_floodwall")
    print(
        f"\n{NODES} workers, {count} tasks each, limit 10/s:"
        f"\n  Celery rate_limit='10/s' (per worker): {rate(own):5.1f}/s over the run, "
        f"busiest second {busiest_second(own)}"
        f"\n  floodwall GlobalLimiter gcra 10/s:     {rate(ours):5.1f}/s over the run, "
        f"busiest second {busiest_second(ours)}"
    )
    # GCRA at 10/s, no burst: one start per 0.1 s on Redis's clock, so at most 11 in a closed
    # second; the workers' clocks see a start a little after its admission.
    assert rate(ours) <= 10.5
    assert busiest_second(ours) <= 11
    assert rate(own) > 2 * rate(ours), "Celery's own limit is per worker: it should admit more"


def test_celery_a_dependency_outage_causes_no_retry_storm(
    broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, db = broker
    tasks = _Client(url)
    variants = ("flaky_naive", "flaky_budget", "flaky_guarded")
    per_second, outage = 10, 10.0
    with Workers(url, tmp_path) as workers:
        for n in range(NODES):
            _celery(workers, f"w{n}")
        _nodes_up(db, workers, NODES)
        db.set("dependency:down", "1", px=int(outage * 1000))
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < outage:
            for name in variants:
                tasks.send(name, sent)
            sent += 1
            time.sleep(max(0.0, started + sent / per_second - time.monotonic()))

        def settled() -> bool:
            return all(
                db.llen(f"done:{name}") + db.llen(f"failed:{name}") >= sent for name in variants
            )

        until(settled, 60, "every task to succeed or fail for good", workers)
    figures = {}
    for name in variants:
        runs = db.llen(f"ran:{name}")
        done = db.llen(f"done:{name}")
        again = db.llen(f"again:{name}")
        figures[name] = runs / sent
        print(
            f"\n{name:14s} {sent} tasks: {runs / sent:.2f} executions per task, "
            f"{done} succeeded, {sent - done} failed, {again} re-published"
        )
    assert figures["flaky_budget"] <= 1.2
    assert figures["flaky_guarded"] <= 1.2
    assert figures["flaky_naive"] > figures["flaky_budget"]
    # The breaker's refusals deferred tasks by at least their retry_after: none ran early.
    for line in strings(db, "again:flaky_guarded"):
        when, retry_after = line.split()
        if retry_after != "None":
            assert float(when) >= float(retry_after)
    # A deferred task is not lost: every task that failed for good had an execution fail (and
    # its retry refused by the budget); the deferred ones ran once the dependency was back.
    done, runs = db.llen("done:flaky_guarded"), db.llen("ran:flaky_guarded")
    assert sent - done <= runs - done
    assert done > db.llen("done:flaky_naive")


def test_celery_a_redelivered_acks_late_task_does_not_repeat_its_side_effect(
    broker: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, db = broker
    tasks = _Client(url)
    visibility = 2.0
    with Workers(url, tmp_path, FW_VISIBILITY=str(visibility)) as workers:
        db.set("hold", "1")
        _celery(workers, "doomed", concurrency=2)
        tasks.send("charge_naive", "order-1")
        tasks.send("charge_guarded", "order-2")
        until(lambda: db.llen("holding") >= 2, 60, "both tasks to finish and hold", workers)
        workers.kill(workers.procs[0], signal.SIGKILL)  # the node and its pool, before any ack
        db.delete("hold")
        _celery(workers, "survivor")

        def redelivered() -> bool:
            return db.llen("done:charge_naive") >= 2 and db.llen("done:charge_guarded") >= 2

        until(redelivered, 60, "both messages to be redelivered and finish", workers)
    naive = strings(db, "effects:charge_naive")
    guarded = strings(db, "effects:charge_guarded")
    print(
        f"\nkill -9 before the ack, redelivered after the {visibility:g}s visibility timeout:"
        f"\n  plain acks_late task:     side effect ran {len(naive)} times"
        f"\n  floodwall idempotent task: side effect ran {len(guarded)} time(s), "
        f"{db.llen('done:charge_guarded')} deliveries finished"
    )
    assert naive == ["order-1", "order-1"]
    assert guarded == ["order-2"]
