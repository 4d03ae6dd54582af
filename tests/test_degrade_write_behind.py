"""WriteBehind on the memory queue and a FakeClock: deferred, delivered in order, retried
through an outage with backoff, dead-lettered when asked, bounded. Redis Streams and the
PostgreSQL ledger (with a SIGKILL) are in integration/test_degrade_write_behind.py."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import floodwall as fw
from floodwall.backoff import Fixed
from floodwall.degrade import BacklogFullError
from floodwall.shared import MemoryQueue, Message, WriteBehind


class Ledger:
    """A downstream that applies each write once per idempotency key (as a table with a
    unique key would), records every delivery, and fails while ``down``."""

    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}
        self.deliveries: list[str] = []
        self.down: Exception | None = None

    def __call__(self, payload: Any) -> None:
        key = fw.current_idempotency_key()
        assert key is not None, "every delivery carries its idempotency key"
        self.deliveries.append(key)
        if self.down is not None:
            raise self.down
        self.rows.setdefault(key, payload)


def test_submit_defers_and_deliver_applies_in_order(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    events: list[fw.Event] = []
    writer = WriteBehind(ledger, clock=clock, listeners=[events.append])
    receipts = [writer.submit({"n": n}, key=f"w{n}") for n in range(5)]
    assert ledger.deliveries == [] and writer.pending() == 5
    assert receipts[0].key == "w0" and receipts[0].id
    assert writer.deliver() == 5
    assert list(ledger.rows) == [f"w{n}" for n in range(5)]
    assert writer.pending() == 0
    assert (writer.deferred, writer.delivered) == (5, 5)
    assert [e.kind for e in events].count("deferred") == 5


def test_the_key_comes_from_the_ambient_idempotency_key(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    writer = WriteBehind(ledger, clock=clock)
    with fw.idempotency_key("order-42"):
        receipt = writer.submit("paid")
    assert receipt.key == "order-42"
    fresh = writer.submit("anonymous")
    assert len(fresh.key) == 32
    writer.deliver()
    assert set(ledger.rows) == {"order-42", fresh.key}


def test_an_outage_delays_writes_and_loses_none(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    writer = WriteBehind(ledger, backoff=Fixed(2.0), clock=clock, rng=random.Random(1), batch=3)
    for n in range(10):
        writer.submit(n, key=f"w{n}")
    writer.deliver(limit=4)
    ledger.down = ConnectionError("database down")
    assert writer.deliver() == 0
    assert writer.failures == 1 and writer.snapshot()["retry_in"] == 2.0
    assert writer.deliver() == 0 and writer.failures == 1, "no attempt before the retry is due"
    clock.advance(2.0)
    assert writer.deliver() == 0 and writer.failures == 2
    ledger.down = None
    clock.advance(2.0)
    assert writer.deliver() == 6
    assert list(ledger.rows) == [f"w{n}" for n in range(10)], "in order, none lost"
    assert ledger.deliveries.count("w4") == 3, "the head was retried; nothing overtook it"
    assert writer.pending() == 0


def test_backoff_grows_and_honours_retry_after(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    writer = WriteBehind(ledger, clock=clock, rng=random.Random(3))
    writer.submit("x", key="x")
    ledger.down = fw.RateLimitedError("db", "too many writes", 7.5)
    writer.deliver()
    assert writer.core.wait(clock.monotonic()) >= 7.5
    ledger.down = ConnectionError()
    waits = []
    for _ in range(8):
        clock.advance(writer.core.wait(clock.monotonic()))
        writer.deliver()
        waits.append(writer.core.wait(clock.monotonic()))
    assert max(waits) <= 10.0, "capped"
    assert all(w >= 0 for w in waits)


def test_max_attempts_dead_letters_and_moves_on(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    dead: list[tuple[Message, Exception]] = []
    writer = WriteBehind(
        lambda payload: ledger(payload) if payload != "poison" else 1 / 0,
        max_attempts=3,
        dead_letter=lambda message, exc: dead.append((message, exc)),
        backoff=Fixed(1.0),
        clock=clock,
    )
    writer.submit("poison", key="p")
    writer.submit("fine", key="f")
    for _ in range(3):
        writer.deliver()
        clock.advance(1.0)
    assert [m.key for m, _ in dead] == ["p"] and isinstance(dead[0][1], ZeroDivisionError)
    assert list(ledger.rows) == ["f"]
    assert (writer.dead_lettered, writer.failures) == (1, 3)


def test_a_full_queue_rejects_or_writes_through(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    bounded = WriteBehind(ledger, max_pending=2, clock=clock)
    bounded.submit(1)
    bounded.submit(2)
    with pytest.raises(BacklogFullError, match="queue is full") as caught:
        bounded.submit(3)
    assert caught.value.kind == "backlog_full" and bounded.rejected == 1
    through = WriteBehind(ledger, queue=MemoryQueue(1), on_full="write_through", clock=clock)
    through.submit("queued", key="q")
    receipt = through.submit("now", key="n")
    assert receipt.id == "" and ledger.rows["n"] == "now" and through.written_through == 1


def test_writes_go_through_the_policy(clock: fw.FakeClock) -> None:
    ledger = Ledger()
    breaker = fw.CircuitBreaker(
        "db", failure_rate=None, error_count=1, minimum_calls=1, open_duration=5, clock=clock
    )
    writer = WriteBehind(ledger, policy=breaker, backoff=Fixed(0.1), clock=clock)
    writer.submit("a", key="a")
    ledger.down = ConnectionError()
    writer.deliver()  # fails and opens the breaker
    ledger.down = None
    clock.advance(0.1)
    writer.deliver()  # the breaker refuses: retry after its open duration
    assert writer.core.wait(clock.monotonic()) == pytest.approx(4.9, abs=0.01)
    clock.advance(5)
    assert writer.deliver() == 1


async def test_async_submit_and_background_delivery(clock: fw.FakeClock) -> None:
    applied: list[Any] = []

    async def write(payload: Any) -> None:
        applied.append((fw.current_idempotency_key(), payload))

    writer = WriteBehind(write, clock=clock)
    task = asyncio.create_task(writer.run_async())
    for n in range(3):
        await writer.submit_async(n, key=f"k{n}")
    for _ in range(3):
        clock.advance(writer.idle_wait)
        await asyncio.sleep(0)
    assert applied == [("k0", 0), ("k1", 1), ("k2", 2)]
    writer.stop()
    clock.advance(writer.idle_wait)
    await asyncio.wait_for(task, 1)
    with pytest.raises(fw.ConfigError, match="async write; use the async API"):
        writer.deliver()


def test_validation() -> None:
    with pytest.raises(fw.ConfigError, match="write must be callable"):
        WriteBehind("nope")  # type: ignore[arg-type]
    with pytest.raises(fw.ConfigError, match="on_full must be"):
        WriteBehind(print, on_full="drop")  # type: ignore[arg-type]
    with pytest.raises(fw.ConfigError, match="max_pending must be an integer >= 1"):
        MemoryQueue(0)
    assert repr(WriteBehind(print)) == "WriteBehind('write_behind', memory)"
