"""The task guard core (issue 21): what one delivery of a task message becomes.

No queue library and no sleeping: a :class:`FakeClock` and a fake wall clock drive every
decision; the queue shells (Celery, Dramatiq, arq) are tested on real workers in
``tests/integration/test_task_queues.py`` and ``test_task_queue_arq.py``.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import floodwall as fw
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
from floodwall.stores.memory import MemoryStore


class Wall:
    """A wall clock the test moves."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _retry(clock: fw.FakeClock, **options: Any) -> fw.Retry:
    options.setdefault("backoff", fw.backoff.Fixed(2.0))
    return fw.Retry("task", attempts=3, clock=clock, **options)


def _down() -> str:
    raise ConnectionError("dependency down")


def test_tasks_a_success_is_done_and_counted(clock: fw.FakeClock) -> None:
    guard = TaskGuard(retry=_retry(clock), clock=clock)
    outcome = guard.run(Delivery("t", "m1"), lambda x: x * 2, (21,))
    assert outcome == Done(42)
    assert guard.snapshot()["executions"] == 1


def test_tasks_a_failure_is_retried_with_the_next_attempt_in_its_headers(
    clock: fw.FakeClock,
) -> None:
    guard = TaskGuard(retry=_retry(clock, budget=None), clock=clock)
    first = guard.run(Delivery("t", "m1"), _down)
    assert isinstance(first, Again) and first.kind == "retry"
    assert first.delay == 2.0 and first.headers[ATTEMPT] == "2"
    again = Delivery.read("t", "m1", first.headers)
    second = guard.run(again, _down)
    assert isinstance(second, Again) and second.headers[ATTEMPT] == "3"
    with pytest.raises(ConnectionError) as raised:
        guard.run(Delivery.read("t", "m1", second.headers), _down)  # attempts=3: no more
    assert fw.gave_up(raised.value) is not None
    assert guard.snapshot() == {
        "executions": 3, "replays": 0, "deferred": 0, "retried": 2, "failed": 1,
    }  # fmt: skip


def test_tasks_a_retry_runs_under_its_own_marker_and_enqueues_children_with_it(
    clock: fw.FakeClock,
) -> None:
    guard = TaskGuard(retry=_retry(clock), clock=clock)
    seen: list[Any] = []

    def task() -> None:
        seen.append((fw.current_retry(), outgoing_headers()))

    guard.run(Delivery("parent", "m1", attempt=2), task)
    guard.run(Delivery("parent", "m2"), task)
    (marker, headers), (first_marker, first_headers) = seen
    assert marker == fw.RetryMarker(2, "parent") and headers == {RETRY: "2;parent"}
    assert first_marker is None and first_headers == {}
    assert fw.current_retry() is None  # restored after the run


def test_tasks_a_chain_retries_at_one_layer_only(clock: fw.FakeClock) -> None:
    """A child enqueued by a retrying parent carries its marker: the child's own failure is
    not retried (the parent's layer retries), so 3 x 3 does not happen."""
    guard = TaskGuard(retry=_retry(clock), clock=clock)
    child = Delivery.read("child", "c1", {RETRY: "2;parent"})
    assert child.inherited == fw.RetryMarker(2, "parent")
    seen: list[Any] = []

    def failing() -> None:
        seen.append(fw.current_retry())
        raise ConnectionError("down")

    with pytest.raises(ConnectionError) as raised:
        guard.run(child, failing)
    assert seen == [fw.RetryMarker(2, "parent")]
    record = fw.gave_up(raised.value)
    assert record is None or record.cause == "marker"
    assert guard.snapshot()["retried"] == 0


def test_tasks_a_failure_a_nested_retry_already_retried_is_not_retried_again(
    clock: fw.FakeClock,
) -> None:
    guard = TaskGuard(retry=_retry(clock), clock=clock)
    inner = fw.Retry("http", attempts=2, backoff=fw.backoff.Fixed(0.0), clock=clock, budget=None)
    calls: list[int] = []

    def task() -> None:
        def call() -> None:
            calls.append(1)
            raise ConnectionError("down")

        inner.call(call)

    with pytest.raises(ConnectionError):
        guard.run(Delivery("t", "m1"), task)
    assert len(calls) == 2  # the inner retry's two attempts, and no task retry on top


def test_tasks_an_open_breaker_defers_by_retry_after_without_running(
    clock: fw.FakeClock,
) -> None:
    breaker = fw.CircuitBreaker("dep", minimum_calls=1, open_duration=5.0, clock=clock)
    wall = Wall()
    guard = TaskGuard(breaker, retry=_retry(clock), clock=clock, wall=wall, defer_jitter=0.5)
    with pytest.raises(ConnectionError):  # opens the breaker (its last attempt: not retried)
        guard.run(Delivery("t", "m0", attempt=3), _down)
    ran: list[int] = []
    outcome = guard.run(Delivery("t", "m1"), lambda: ran.append(1))
    assert ran == []
    assert isinstance(outcome, Again) and outcome.kind == "defer"
    assert 5.0 <= outcome.delay <= 7.5  # retry_after x (1 + U(0, 0.5))
    assert isinstance(outcome.error, fw.CircuitOpenError)
    assert outcome.headers[ATTEMPT] == "1"  # a deferral is not an attempt
    assert float(outcome.headers[DEFERRED]) == wall.now


def test_tasks_deferrals_stop_after_max_defer(clock: fw.FakeClock) -> None:
    breaker = fw.CircuitBreaker("dep", minimum_calls=1, open_duration=10.0, clock=clock)
    breaker.force_open()  # names no retry_after: the guard's defer=10 s
    wall = Wall()
    guard = TaskGuard(breaker, clock=clock, wall=wall, max_defer=30.0, defer=10.0, defer_jitter=0.0)
    delivery = Delivery("t", "m1")
    for _ in range(3):  # back after 10, 20 and 30 s: within max_defer
        outcome = guard.run(delivery, lambda: None)
        assert isinstance(outcome, Again)
        delivery = Delivery.read("t", "m1", outcome.headers)
        wall.now += outcome.delay
    with pytest.raises(fw.CircuitOpenError) as raised:
        guard.run(delivery, lambda: None)  # 30 s deferred + 10 s more > 30 s
    assert any("max_defer" in note for note in raised.value.__notes__)


def test_tasks_the_budget_counts_first_deliveries_and_refuses_a_storm(
    clock: fw.FakeClock,
) -> None:
    budget = fw.RetryBudget(0.1, min_per_second=0.0, clock=clock)
    guard = TaskGuard(retry=_retry(clock, budget=budget), clock=clock)
    outcomes = _raising_failures(guard, 10)
    retried = [o for o in outcomes if isinstance(o, Again)]
    assert len(retried) == 1  # 10 % of 10 first deliveries
    snap = budget.snapshot()
    assert (snap.requests, snap.retries) == (10, 1)
    # A retried delivery (attempt 2) and a deferred one deposit nothing.
    with pytest.raises(ConnectionError):
        guard.run(Delivery("t", "m0", attempt=2), _down)
    guard.run(Delivery("t", "m1", deferred_since=1.0), lambda: None)
    assert budget.snapshot().requests == 10


def _raising_failures(guard: TaskGuard, count: int) -> list[Any]:
    out: list[Any] = []
    for i in range(count):
        try:
            out.append(guard.run(Delivery("t", f"m{i}"), _down))
        except ConnectionError as error:
            out.append(error)
    return out


def test_tasks_a_redelivered_message_replays_its_result(clock: fw.FakeClock) -> None:
    idem = fw.Idempotency("memory://", clock=clock)
    guard = TaskGuard(idempotency=idem, clock=clock)
    effects: list[str] = []

    def charge(order: str) -> dict[str, str]:
        effects.append(order)
        return {"charged": order, "key": str(fw.current_idempotency_key())}

    first = guard.run(Delivery("charge", "m1"), charge, ("o-1",))
    again = guard.run(Delivery("charge", "m1"), charge, ("o-1",))  # the same message, redelivered
    other = guard.run(Delivery("charge", "m2"), charge, ("o-1",))  # another message
    assert effects == ["o-1", "o-1"]
    assert first == again == Done({"charged": "o-1", "key": "charge:m1"})
    assert other == Done({"charged": "o-1", "key": "charge:m2"})
    assert guard.snapshot()["replays"] == 1


def test_tasks_a_claim_held_elsewhere_defers_until_it_would_lapse(clock: fw.FakeClock) -> None:
    # the store's claim lapses on the test's clock too ("memory://" keeps real time: a busy
    # machine took 10 ms off the 30 s between the claim and the second delivery)
    idem = fw.Idempotency(MemoryStore(clock=clock), lock_ttl=30.0, clock=clock)
    guard = TaskGuard(idempotency=idem, key=lambda order: order, clock=clock, defer_jitter=0.0)
    inner: list[Any] = []

    def charge(order: str) -> str:
        inner.append(guard.run(Delivery("charge", "m2"), charge_again, (order,)))
        return order

    def charge_again(order: str) -> str:
        raise AssertionError("must not run while the first delivery holds the key")

    assert guard.run(Delivery("charge", "m1"), charge, ("o-9",)) == Done("o-9")
    (held,) = inner
    assert isinstance(held, Again) and held.kind == "defer"
    assert isinstance(held.error, fw.DuplicateInFlightError)
    assert held.delay == pytest.approx(30.0)


def test_tasks_the_async_shell_decides_alike(clock: fw.FakeClock) -> None:
    breaker = fw.CircuitBreaker("dep", minimum_calls=1, open_duration=5.0, clock=clock)
    guard = TaskGuard(breaker, retry=_retry(clock, budget=None), clock=clock, defer_jitter=0.0)

    async def down() -> None:
        raise ConnectionError("down")

    async def ok() -> str:
        return "ok"

    async def scenario() -> list[Any]:
        return [
            await guard.run_async(Delivery("t", "m1"), down),
            await guard.run_async(Delivery("t", "m2"), ok),
        ]

    failed, refused = asyncio.run(scenario())
    assert isinstance(failed, Again) and failed.kind == "retry" and failed.delay == 2.0
    assert isinstance(refused, Again) and refused.kind == "defer" and refused.delay == 5.0


def test_tasks_options_are_checked_at_construction() -> None:
    with pytest.raises(
        fw.ConfigError, match=r"max_defer must be a finite number of seconds > 0, got 0"
    ):
        TaskGuard(max_defer=0)
    with pytest.raises(fw.ConfigError, match=r"defer_jitter must be .* >= 0, got -1"):
        TaskGuard(defer_jitter=-1)
    with pytest.raises(fw.ConfigError, match=r"policy must be a floodwall Policy, got 'x'"):
        TaskGuard("x")  # type: ignore[arg-type]
    with pytest.raises(fw.ConfigError, match=r"retry must be a floodwall Retry"):
        TaskGuard(retry=fw.CircuitBreaker("b"))  # type: ignore[arg-type]


@given(
    attempt=st.integers(1, 10_000),
    inherited=st.none() | st.tuples(st.integers(2, 99), st.text("abc-_.", min_size=1)),
    since=st.none() | st.floats(0, 4e9, allow_nan=False),
)
def test_tasks_headers_round_trip(
    attempt: int, inherited: tuple[int, str] | None, since: float | None
) -> None:
    marker = None if inherited is None else fw.RetryMarker(*inherited)
    delivery = Delivery("t", "m", 1, marker, None)
    read = Delivery.read("t", "m", delivery.headers(attempt, since))
    assert read.attempt == attempt and read.inherited == marker
    assert read.deferred_since == (None if since is None else pytest.approx(since, abs=1e-3))


@given(
    st.dictionaries(
        st.sampled_from([ATTEMPT, RETRY, DEFERRED, "x"]),
        st.text() | st.none() | st.integers() | st.floats() | st.binary(),
    )
)
@example({ATTEMPT: 10**400, DEFERRED: -(10**400)})  # a JSON integer past float: OverflowError
def test_tasks_malformed_headers_read_as_a_first_delivery(headers: dict[str, Any]) -> None:
    read = Delivery.read("t", "m", headers)
    assert read.attempt >= 1
    assert read.inherited is None or read.inherited.attempt >= 2
    assert read.deferred_since is None or read.deferred_since >= 0


def test_tasks_jitter_spreads_deferrals(clock: fw.FakeClock) -> None:
    breaker = fw.CircuitBreaker("dep", minimum_calls=1, open_duration=4.0, clock=clock)
    breaker.force_open()
    guard = TaskGuard(breaker, clock=clock, defer=4.0, rng=random.Random(3))
    delays = {guard.run(Delivery("t", f"m{i}"), lambda: None).delay for i in range(20)}  # type: ignore[union-attr]
    assert len(delays) == 20 and min(delays) >= 4.0 and max(delays) <= 6.0


def test_tasks_an_idempotency_store_outage_defers_rather_than_runs_or_fails(
    clock: fw.FakeClock,
) -> None:
    from conftest import SwitchableStore

    store = SwitchableStore(clock)
    guard = TaskGuard(idempotency=fw.Idempotency(store, clock=clock), clock=clock, defer_jitter=0.0)
    store.down = True
    ran: list[int] = []
    outcome = guard.run(Delivery("t", "m1"), lambda: ran.append(1))
    assert ran == []
    assert isinstance(outcome, Again) and outcome.kind == "defer" and outcome.delay == 5.0
    store.down = False
    assert guard.run(Delivery("t", "m1"), lambda: ran.append(1)) == Done(None)
    assert ran == [1]


def test_tasks_a_global_limit_whose_store_is_down_defers_like_a_rate_limit(
    clock: fw.FakeClock,
) -> None:
    from conftest import SwitchableStore
    from floodwall.shared import GlobalLimiter

    store = SwitchableStore(clock)
    limiter = GlobalLimiter(
        "fixed", "100/s", store=store, on_store_error="fail_closed", batch=False, clock=clock
    )
    guard = TaskGuard(limiter, clock=clock, defer_jitter=0.0)
    store.down = True
    ran: list[int] = []
    outcome = guard.run(Delivery("t", "m1"), lambda: ran.append(1))
    assert ran == []
    assert isinstance(outcome, Again) and outcome.kind == "defer"
    assert isinstance(outcome.error, fw.LimitStoreUnavailableError)
    assert outcome.delay > 0  # until the store is probed again
    store.down = False
    clock.advance(outcome.delay)
    assert guard.run(Delivery("t", "m1"), lambda: ran.append(1)) == Done(None)
    assert ran == [1]


def test_tasks_a_delivery_back_before_its_until_is_held_without_running(
    clock: fw.FakeClock,
) -> None:
    wall = Wall()
    breaker = fw.CircuitBreaker("dep", clock=clock)
    breaker.force_open()
    guard = TaskGuard(breaker, clock=clock, wall=wall)
    early = Delivery("t", "m1", attempt=2, deferred_since=wall.now - 5, until=wall.now + 30)
    ran: list[int] = []
    held = guard.run(early, lambda: ran.append(1))
    assert ran == [] and guard.snapshot() == dict.fromkeys(guard.snapshot(), 0)
    assert isinstance(held, Again) and held.kind == "hold" and held.delay == 30.0
    assert held.headers[UNTIL] == f"{wall.now + 30:.3f}"  # kept for the next step
    assert held.headers[ATTEMPT] == "2" and float(held.headers[DEFERRED]) == wall.now - 5
    assert asyncio.run(guard.run_async(early, _async_append(ran))).kind == "hold"  # type: ignore[union-attr]
    wall.now += 30
    breaker.reset()
    assert guard.run(early, lambda: ran.append(1)) == Done(None)
    assert ran == [1]
    assert Delivery.read("t", "m", {UNTIL: "nan"}).until is None


def _async_append(ran: list[int]) -> Any:
    async def append() -> None:
        ran.append(1)

    return append


def test_celery_countdowns_are_capped_at_half_the_visibility_timeout() -> None:
    from celery import Celery

    from floodwall.celery import hold_limit

    assert hold_limit(Celery(broker="redis://127.0.0.1:6379/0")) == 1800.0  # kombu: 3600 s
    assert hold_limit(Celery(broker="sqs://")) == 900.0  # kombu: 1800 s
    app = Celery(broker="rediss://127.0.0.1:6380/0")
    app.conf.broker_transport_options = {"visibility_timeout": 10}
    assert hold_limit(app) == 5.0
    assert hold_limit(Celery(broker="amqp://guest@localhost//")) is None  # no visibility timeout
