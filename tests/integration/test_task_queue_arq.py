"""arq with real worker processes on a real Redis (issue 21): the three task-queue scenarios of
``test_task_queues.py`` where they apply.

arq runs coroutines on one event loop per process and has no prefork pool: "four workers" are
four ``arq`` processes (as on four hosts), each running up to ten jobs at once. arq has no rate
limit of its own (the per-worker figure is floodwall's in-memory GCRA in each process) and
retries no failure by itself (the naive figure is its documented pattern, ``raise
Retry(defer=...)`` by hand, three times). A job whose worker died runs again once its
in-progress marker expires (``job_timeout`` + 10 s): the kill -9 scenario applies as is.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.jobs import Job

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


@pytest.fixture
def broker() -> Iterator[tuple[str, redis.Redis]]:
    with throwaway_redis() as pair:
        yield pair


def _start(workers: Workers, name: str, count: int = 1) -> list[object]:
    return [
        workers.start("arq", "arq_tasks.WorkerSettings", name=f"{name}{n}") for n in range(count)
    ]


class Client:
    """Enqueues jobs and reads their results from the test (one event loop of its own)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool: ArqRedis = self.loop.run_until_complete(create_pool(RedisSettings.from_dsn(url)))
        self.jobs: dict[str, list[str]] = {}

    def send(self, function: str, *args: object) -> None:
        job = self.loop.run_until_complete(self.pool.enqueue_job(function, *args))
        assert job is not None
        self.jobs.setdefault(function, []).append(job.job_id)

    def outcomes(self, function: str) -> tuple[int, int]:
        """``(succeeded, failed)`` of the function's jobs that finished."""

        async def read() -> tuple[int, int]:
            infos = [await Job(job_id, self.pool).result_info() for job_id in self.jobs[function]]
            done = [info for info in infos if info is not None]
            return sum(info.success for info in done), sum(not info.success for info in done)

        return self.loop.run_until_complete(read())

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


@pytest.fixture
def client(broker: tuple[str, redis.Redis]) -> Iterator[Client]:
    queue = Client(broker[0])
    yield queue
    queue.close()


def _ready(client: Client, db: redis.Redis, workers: Workers, count: int) -> None:
    for i in range(count):
        client.send("ping", i)
    until(lambda: db.llen("ran:ping") >= count, 60, "the workers to start", workers)


def test_arq_a_global_rate_limit_holds_across_four_worker_processes(
    broker: tuple[str, redis.Redis], client: Client, tmp_path: Path
) -> None:
    url, db = broker
    count = 40
    names = ("limited_local", "limited_floodwall", "limited_host")
    with host_store_name() as host, Workers(url, tmp_path, FW_HOST=host) as workers:
        _start(workers, "w", WORKERS)
        _ready(client, db, workers, 2 * WORKERS)
        for name in names:
            for i in range(count):
                client.send(name, i)

            def ran(key: str = f"ran:{name}") -> bool:
                return bool(db.llen(key) >= count)

            until(ran, 60, name, workers)
    own, ours, host_wide = (times(db, f"ran:{name}") for name in names)
    print(
        f"\narq, {WORKERS} worker processes, {count} jobs each, limit 10/s:"
        f"\n  per-process GCRA (in memory)  {limit_figures(own)}"
        f"\n  GlobalLimiter on Redis        {limit_figures(ours)}"
        f"\n  GlobalLimiter on host://      {limit_figures(host_wide)}"
    )
    for stamps in (ours, host_wide):
        assert rate(stamps) <= 10.5
        assert busiest_second(stamps) <= 11
    assert busiest_second(own) > 11, "a per-process limit should break the 10/s bound"


def test_arq_a_dependency_outage_causes_no_retry_storm(
    broker: tuple[str, redis.Redis], client: Client, tmp_path: Path
) -> None:
    url, db = broker
    variants = ("flaky_naive", "flaky_budget", "flaky_guarded")
    per_second, outage = 10, 10.0
    with Workers(url, tmp_path) as workers:
        _start(workers, "w", WORKERS)
        _ready(client, db, workers, 2 * WORKERS)
        db.set("dependency:down", "1", px=int(outage * 1000))
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < outage:
            for name in variants:
                client.send(name, sent)
            sent += 1
            time.sleep(max(0.0, started + sent / per_second - time.monotonic()))

        def settled() -> bool:
            return all(sum(client.outcomes(name)) >= sent for name in variants)

        until(settled, 90, "every job to succeed or fail for good", workers, lambda: {
            name: client.outcomes(name) for name in variants
        })  # fmt: skip
    figures = {}
    print(f"\narq, {WORKERS} worker processes, a dependency down for {outage:g} s:")
    for name in variants:
        runs = db.llen(f"ran:{name}")
        done, failed = client.outcomes(name)
        figures[name] = runs / sent
        print(
            f"  {name:14s} {sent} jobs: {runs / sent:.2f} executions per job, "
            f"{done} succeeded, {failed} failed"
        )
    assert figures["flaky_budget"] <= 1.2
    assert figures["flaky_guarded"] <= 1.2
    assert figures["flaky_naive"] > figures["flaky_budget"]
    done, _ = client.outcomes("flaky_guarded")
    runs = db.llen("ran:flaky_guarded")
    assert sent - done <= runs - done  # every job that failed for good had an execution fail
    assert done > client.outcomes("flaky_budget")[0], "deferred, not refused: more complete"


def test_arq_a_job_run_again_after_kill_9_does_not_repeat_its_side_effect(
    broker: tuple[str, redis.Redis], client: Client, tmp_path: Path
) -> None:
    url, db = broker
    timeout = 1.0
    with Workers(url, tmp_path, FW_JOB_TIMEOUT=str(timeout)) as workers:
        db.set("hold", "1")
        (doomed,) = _start(workers, "doomed")
        client.send("charge_naive", "order-1")
        client.send("charge_guarded", "order-2")
        until(lambda: db.llen("holding") >= 2, 60, "both jobs to finish and hold", workers)
        workers.kill(doomed, signal.SIGKILL)  # type: ignore[arg-type]
        db.delete("hold")
        _start(workers, "survivor")

        def again() -> bool:
            return client.outcomes("charge_naive")[0] + client.outcomes("charge_guarded")[0] >= 2

        until(again, 60, "both jobs to run again and finish", workers)
    naive = strings(db, "effects:charge_naive")
    guarded = strings(db, "effects:charge_guarded")
    print(
        f"\narq: kill -9 before the job was recorded done, run again {timeout + 10:g} s later:"
        f"\n  plain job:                side effect ran {len(naive)} times"
        f"\n  floodwall idempotent job: side effect ran {len(guarded)} time(s)"
    )
    assert naive == ["order-1", "order-1"]
    assert guarded == ["order-2"]


def test_arq_a_finished_job_leaves_no_floodwall_headers_behind(
    broker: tuple[str, redis.Redis],
) -> None:
    """The hash of floodwall's headers beside a deferred or retried job stayed in the broker's
    Redis for a day after the job finished (arq deletes its own retry counter at the finish):
    at 100 such jobs a second, millions of keys. An arq worker in this process, burst mode."""
    from arq.worker import Worker

    import floodwall as fw
    from floodwall.arq import HEADERS, TaskGuard, func
    from floodwall.ratelimit import GCRA

    url, db = broker
    failures: dict[str, int] = {}

    async def limited(ctx: dict[str, Any], i: int) -> int:
        return i

    async def flaky(ctx: dict[str, Any], name: str, fails: int) -> str:
        failures[name] = failures.get(name, 0) + 1
        if failures[name] <= fails:
            raise ConnectionError(f"{name}: the dependency is down")
        return name

    deferring = TaskGuard(GCRA("1/s", burst=0), min_delay=0.05)
    retrying = TaskGuard(retry=fw.Retry("r", attempts=2, backoff=fw.backoff.Fixed(0.05)))
    pool = asyncio.new_event_loop()
    try:

        async def run() -> list[tuple[str, bool]]:
            arq = await create_pool(RedisSettings.from_dsn(url))
            jobs = [
                await arq.enqueue_job("limited", 1, _job_id="limited-1"),
                await arq.enqueue_job("limited", 2, _job_id="limited-2"),  # deferred once
                await arq.enqueue_job("flaky", "retried", 1, _job_id="retried"),
                await arq.enqueue_job("flaky", "failed", 5, _job_id="failed"),
            ]
            worker = Worker(
                functions=[
                    func(limited, guard=deferring, name="limited"),
                    func(flaky, guard=retrying, name="flaky"),
                ],
                redis_pool=arq,
                burst=True,
                poll_delay=0.02,
                handle_signals=False,
            )
            await asyncio.wait_for(worker.main(), 30)
            results = []
            for job in jobs:
                assert job is not None
                info = await job.result_info()
                assert info is not None
                results.append((job.job_id, info.success))
            await worker.close()
            return results

        results = pool.run_until_complete(run())
    finally:
        pool.close()
    assert results == [
        ("limited-1", True),
        ("limited-2", True),
        ("retried", True),
        ("failed", False),
    ]
    assert deferring.snapshot()["deferred"] >= 1 and retrying.snapshot()["retried"] == 2
    assert db.keys(f"{HEADERS}*") == []


def test_arq_deferrals_do_not_use_up_max_tries(broker: tuple[str, redis.Redis]) -> None:
    """QA: a job deferred by floodwall (breaker open, rate limited) used one of arq's
    ``max_tries`` per deferral, so a long outage made arq give up ("max 2 retries exceeded")
    a job that never ran. A deferral gives its try back: ``max_tries`` counts runs, while a
    retried failure still uses one. A real arq worker in this process, burst mode."""
    from arq.worker import Worker

    import floodwall as fw
    from floodwall.arq import TaskGuard, func

    url, _ = broker
    breaker = fw.CircuitBreaker("dependency")
    breaker.force_open("the dependency is down")
    deferring = TaskGuard(breaker, defer=0.05, defer_jitter=0.0, min_delay=0.0)
    retrying = TaskGuard(retry=fw.Retry("r", attempts=5, backoff=fw.backoff.Fixed(0.05)))
    tries: list[int] = []
    deferrals = 6

    async def guarded(ctx: dict[str, Any]) -> int:
        tries.append(ctx["job_try"])
        return len(tries)

    async def failing(ctx: dict[str, Any]) -> None:
        raise ConnectionError("the dependency is down")

    async def run() -> list[tuple[bool, object]]:
        arq = await create_pool(RedisSettings.from_dsn(url))

        async def close_after_deferrals() -> None:
            while deferring.snapshot()["deferred"] < deferrals:  # noqa: ASYNC110 - a counter, no event
                await asyncio.sleep(0.01)
            breaker.reset("the dependency is back")

        jobs = [
            await arq.enqueue_job("guarded", _job_id="guarded"),
            await arq.enqueue_job("failing", _job_id="failing"),
        ]
        worker = Worker(
            functions=[
                func(guarded, guard=deferring, name="guarded", max_tries=2),
                func(failing, guard=retrying, name="failing", max_tries=2),
            ],
            redis_pool=arq,
            burst=True,
            poll_delay=0.01,
            handle_signals=False,
        )
        closer = asyncio.create_task(close_after_deferrals())
        await asyncio.wait_for(worker.main(), 30)
        closer.cancel()  # (done, unless arq gave the job up before its deferrals were over)
        results = []
        for job in jobs:
            assert job is not None
            info = await job.result_info()
            assert info is not None
            results.append((info.success, info.result))
        await worker.close()
        return results

    loop = asyncio.new_event_loop()
    try:
        (done, value), (failed, error) = loop.run_until_complete(run())
    finally:
        loop.close()
    assert deferring.snapshot()["deferred"] >= deferrals > 2
    assert (done, value) == (True, 1)  # it ran once, after the deferrals
    assert tries == [1]  # arq saw its first try: the deferrals gave theirs back
    assert not failed
    assert "max 2 retries exceeded" in str(error)  # a retried failure is a try: arq's bound
    assert retrying.snapshot()["retried"] == 2


def test_arq_enqueue_job_merges_headers_and_never_replaces_a_users_own(
    broker: tuple[str, redis.Redis],
) -> None:
    """QA: ``floodwall.arq.enqueue_job`` replaced what a job's header hash already held (the
    caller's own fields, and on a refused duplicate the existing job's marker). Now the
    caller's ``_headers`` and the ambient marker are merged in, existing fields kept; a
    duplicate arq refuses leaves the existing job's headers as they were."""
    import floodwall as fw
    from floodwall.arq import HEADERS, enqueue_job
    from floodwall.integrations._tasks import RETRY, Delivery

    url, db = broker
    db.hset(f"{HEADERS}job-1", mapping={"tenant": "acme", RETRY: "2;billing"})

    async def run() -> tuple[Any, Any]:
        pool = await create_pool(RedisSettings.from_dsn(url))
        try:
            with fw.retry_marker(3, "checkout"):
                first = await enqueue_job(
                    pool, "charge", 1, _job_id="job-1", _headers={"trace": "t-1"}
                )
                await enqueue_job(pool, "charge", 2, _job_id="job-2", _headers={"trace": "t-2"})
                again = await enqueue_job(pool, "charge", 3, _job_id="job-2", _headers={"x": "y"})
            return first, again
        finally:
            await pool.aclose()

    loop = asyncio.new_event_loop()
    try:
        first, again = loop.run_until_complete(run())
    finally:
        loop.close()
    assert first is not None and again is None  # arq refused the duplicate job-2
    one = _hash(db, f"{HEADERS}job-1")
    assert one == {"tenant": "acme", RETRY: "2;billing", "trace": "t-1"}  # the caller's kept
    two = _hash(db, f"{HEADERS}job-2")
    assert two == {RETRY: "3;checkout", "trace": "t-2"}  # no "x": the refused enqueue left
    delivery = Delivery.read("charge", "job-2", two)
    assert delivery.inherited == fw.RetryMarker(3, "checkout")
    with pytest.raises(TypeError, match="_headers must be a mapping of str to str"):
        asyncio.run(enqueue_job(None, "charge", _headers={"n": 1}))  # type: ignore[arg-type, dict-item]


def test_arq_task_guard_deliveries_reach_a_prometheus_scrape(
    broker: tuple[str, redis.Redis],
) -> None:
    """QA: a task guard's figures reached no metrics exporter. ``register_tasks`` publishes
    them like the inbound guard's: scraped over HTTP from ``prometheus_client``'s server
    while a real arq worker ran deferred, retried and failed jobs."""
    import urllib.request

    from arq.worker import Worker
    from prometheus_client import CollectorRegistry, start_http_server

    import floodwall as fw
    from floodwall.arq import TaskGuard, func
    from floodwall.observe.prometheus import register_tasks
    from floodwall.ratelimit import GCRA

    url, _ = broker
    deferring = TaskGuard(GCRA("1/s", burst=0), min_delay=0.05, name="limited")
    retrying = TaskGuard(
        retry=fw.Retry("r", attempts=2, backoff=fw.backoff.Fixed(0.05)), name="flaky"
    )
    into = CollectorRegistry()
    register_tasks(deferring, into)
    register_tasks(retrying, into)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=into)

    async def limited(ctx: dict[str, Any], i: int) -> int:
        return i

    async def flaky(ctx: dict[str, Any]) -> None:
        raise ConnectionError("the dependency is down")

    async def run() -> None:
        arq = await create_pool(RedisSettings.from_dsn(url))
        for i in range(2):
            await arq.enqueue_job("limited", i)
        await arq.enqueue_job("flaky")
        worker = Worker(
            functions=[
                func(limited, guard=deferring, name="limited"),
                func(flaky, guard=retrying, name="flaky"),
            ],
            redis_pool=arq,
            burst=True,
            poll_delay=0.02,
            handle_signals=False,
        )
        await asyncio.wait_for(worker.main(), 30)
        await worker.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            scrape = answer.read().decode()
    finally:
        loop.close()
        server.shutdown()
        thread.join(5)
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in scrape.splitlines()
        if line.startswith("floodwall_task_deliveries_total")
    }
    family = "floodwall_task_deliveries_total"
    assert samples[f'{family}{{guard="limited",outcome="executions"}}'] == 2
    assert samples[f'{family}{{guard="limited",outcome="deferred"}}'] >= 1
    assert samples[f'{family}{{guard="flaky",outcome="retried"}}'] == 1
    assert samples[f'{family}{{guard="flaky",outcome="failed"}}'] == 1
    assert samples[f'{family}{{guard="flaky",outcome="executions"}}'] == 2


def _hash(db: redis.Redis, key: str) -> dict[str, str]:
    def text(value: object) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return {text(name): text(value) for name, value in db.hgetall(key).items()}
