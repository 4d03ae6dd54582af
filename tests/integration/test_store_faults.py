"""Stop a real Redis under load, then start it again on the same port.

Callers must get their configured behaviour (``fail_open``, ``fail_closed``, ``local``) from the
first failed call on, never an exception from the store; the breaker must keep the outage to a
few failed store calls; and when Redis is back the policies must return to it by themselves.
Figures go to stdout (``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import pytest
from redis import exceptions as redis_exceptions

import floodwall
from floodwall import CircuitOpenError, Event
from floodwall.shared.frequency import Frequency, FrequencyDecision
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.shared.idempotency import Idempotency, IdempotencyUnavailableError
from floodwall.stores import StoreErrorMode, StoreUnavailableError, connect
from floodwall.stores.redis import RedisStore, _execute_async
from servers import FAULT_OPEN, RestartableRedis, store_breaker

pytestmark = pytest.mark.integration

MODES: tuple[StoreErrorMode, ...] = ("fail_open", "fail_closed", "local")
OPEN = FAULT_OPEN


async def test_redis_outage_and_recovery_under_load(restartable_redis: RestartableRedis) -> None:
    store = connect(restartable_redis.url)
    events: list[tuple[float, Event]] = []

    def listen(event: Event) -> None:
        events.append((time.monotonic(), event))

    limiters = {
        mode: Frequency(
            1_000_000,
            60,
            store=store,
            name=f"load-{mode}",
            on_store_error=mode,
            expected_instances=4,
            breaker=store_breaker(mode),
            listeners=[listen],
        )
        for mode in MODES
    }
    decisions: list[tuple[float, str, FrequencyDecision, float]] = []
    escaped: list[BaseException] = []
    stop_load = asyncio.Event()

    async def worker(n: int) -> None:
        while not stop_load.is_set():
            for mode, limiter in limiters.items():
                start = time.monotonic()
                try:
                    decision = await limiter.allow_async(f"user-{n}")
                except BaseException as exc:
                    escaped.append(exc)
                    raise
                decisions.append((start, mode, decision, time.monotonic() - start))
            await asyncio.sleep(0.002)

    workers = [asyncio.create_task(worker(n)) for n in range(4)]
    try:
        await asyncio.sleep(0.3)
        stopped_at = time.monotonic()
        await asyncio.to_thread(restartable_redis.stop)
        down_at = time.monotonic()
        await asyncio.sleep(1.5)
        restart_began = time.monotonic()  # Redis may answer before start() returns
        await asyncio.to_thread(restartable_redis.start)
        restarted_at = time.monotonic()
        await asyncio.sleep(1.0)
    finally:
        stop_load.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await store.aclose()

    assert escaped == []
    before = [d for t, _, d, _ in decisions if t < stopped_at]
    assert before and all(d.degraded is None and d.allowed for d in before)
    during = [(mode, d, took) for t, mode, d, took in decisions if down_at < t < restart_began]
    for mode, decision, _ in during:
        assert decision.degraded == mode, (mode, decision)
        assert decision.allowed is (mode != "fail_closed")
    after = [(t, mode, d) for t, mode, d, _ in decisions if t > restarted_at + 2 * OPEN + 0.2]
    assert after and all(d.degraded is None and d.allowed for _, _, d in after)

    for mode, limiter in limiters.items():
        guard = limiter.guard
        assert guard.state == "up" and guard.outages == 1 and guard.recoveries == 1, mode
        # One failure opens the breaker; then one probe per open period while Redis is away
        # (the outage lasts longer than the 1.5 s pause when a loaded machine stops and
        # restarts the server slowly).
        probes = math.ceil((restarted_at - stopped_at) / OPEN) + 2
        assert guard.failures <= 3 + probes, (mode, guard.snapshot())
    downs = {e.name: t for t, e in events if e.kind == "store_down"}
    ups = {e.name: t for t, e in events if e.kind == "store_up"}
    first_degraded = min(t for t, _, d, _ in decisions if d.degraded is not None)
    slowest = max(took for _, _, took in during)
    print(
        f"\noutage: first degraded decision {1000 * (first_degraded - stopped_at):.0f} ms after "
        f"SIGTERM; slowest decision while down {1000 * slowest:.1f} ms; "
        f"{len(during)} decisions while down; store calls that failed per guard: "
        f"{ {m: lim.guard.failures for m, lim in limiters.items()} }; short-circuited: "
        f"{ {m: lim.guard.short_circuits for m, lim in limiters.items()} }; back "
        f"{ {n: round(1000 * (t - restarted_at)) for n, t in ups.items()} } ms after restart"
    )
    assert set(downs) == set(ups) == {f"load-{m}" for m in limiters}
    assert all(ups[name] - restarted_at < OPEN + 0.5 for name in ups)


def test_idempotency_fails_closed_with_a_typed_error_and_recovers(
    restartable_redis: RestartableRedis,
) -> None:
    store = connect(restartable_redis.url)
    idem = Idempotency(store, breaker=store_breaker("idem"))
    runs: list[int] = []

    def write(n: int) -> str:
        runs.append(n)
        return "ok"

    try:
        with floodwall.idempotency_key("k1"):
            assert idem.call(write, 1) == "ok"
        restartable_redis.stop()
        for attempt in range(6):
            with (
                floodwall.idempotency_key(f"down-{attempt}"),
                pytest.raises(IdempotencyUnavailableError) as caught,
            ):
                idem.call(write, 2)
            assert isinstance(caught.value.__cause__, StoreUnavailableError | CircuitOpenError)
        assert runs == [1] and idem.guard.failures == 3
        restartable_redis.start()
        time.sleep(OPEN + 0.05)
        with floodwall.idempotency_key("k2"):
            assert idem.call(lambda: "back") == "back"
        assert idem.guard.state == "up"
    finally:
        store.close()
        with contextlib.suppress(Exception):
            restartable_redis.stop()


def test_a_restart_between_calls_costs_no_failed_call(restartable_redis: RestartableRedis) -> None:
    """The pooled socket dies with the server; the next command retries once on a fresh one."""
    store = RedisStore(restartable_redis.url, prefix="restart:")
    limiter = GlobalLimiter("fixed_window", "1000/s", store=store, name="restart")
    try:
        assert limiter.try_acquire()
        restartable_redis.stop()
        restartable_redis.start()
        assert limiter.try_acquire()  # NOSCRIPT on the fresh server is answered by one EVAL
        assert limiter.guard.failures == 0
        assert limiter.guard.state == "up"
        pool = store.client().connection_pool
        assert len(pool._available_connections) + len(pool._in_use_connections) == 1
    finally:
        store.close()


def test_an_error_reply_keeps_the_pooled_connection(restartable_redis: RestartableRedis) -> None:
    """A whole error reply leaves the connection in step: it is reused, not dropped."""
    store = RedisStore(restartable_redis.url, prefix="reply:")
    try:
        run = store._runner()
        assert run("SET", "reply:k", "v") == b"OK"
        with pytest.raises(redis_exceptions.ResponseError):
            run("INCR", "reply:k")  # not an integer
        pool = store.client().connection_pool
        first = pool._available_connections[0]
        assert run("GET", "reply:k") == b"v"
        assert pool._available_connections == [first]
        assert first._sock is not None
    finally:
        store.close()


async def test_a_restart_between_async_calls_costs_no_failed_call(
    restartable_redis: RestartableRedis,
) -> None:
    """Async: the dead pooled socket is retried once on a fresh one, and the restarted server's
    NOSCRIPT is answered by one EVAL inside that same call."""
    store = RedisStore(restartable_redis.url, prefix="arestart:")
    limiter = GlobalLimiter("fixed_window", "1000/s", store=store, name="arestart")
    try:
        assert await limiter.try_acquire_async()
        restartable_redis.stop()
        restartable_redis.start()
        assert await limiter.try_acquire_async()
        assert limiter.guard.failures == 0
        assert limiter.guard.state == "up"
    finally:
        await store.aclose()
        store.close()


async def test_a_cancelled_async_command_never_leaves_its_reply_behind(
    restartable_redis: RestartableRedis,
) -> None:
    """Cancelled mid-reply, the connection is dropped: the next command reads its own reply."""
    store = RedisStore(restartable_redis.url, prefix="cancel:", max_connections=1)
    try:
        pool = (await store.async_client()).connection_pool
        waiting = asyncio.create_task(_execute_async(pool, "BLPOP", "cancel:list", "1"))
        await asyncio.sleep(0.1)  # the BLPOP is on the server, its reply not yet sent
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert await _execute_async(pool, "SET", "cancel:k", "v") == b"OK"
        assert await _execute_async(pool, "GET", "cancel:k") == b"v"
    finally:
        await store.aclose()
