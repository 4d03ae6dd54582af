"""The store guard: breaker timing on a fake clock, the three modes, events and counters.

The failing store here is a real :class:`Store` (memory underneath) whose backend can be
switched off: it raises :class:`StoreUnavailableError` from a real ``ConnectionRefusedError``,
as the Redis and SQL stores do. Fault tests against a real Redis are in
``tests/integration/test_store_faults.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from conftest import ONCE, SwitchableStore, once
from floodwall import CircuitOpenError, ConfigError, Event, FakeClock, LimitStoreUnavailableError
from floodwall.shared._global_ops import FIXED
from floodwall.shared.frequency import Frequency
from floodwall.stores import Arg, MemoryStore, Op, R, StoreGuard, StoreTimeoutError


@pytest.fixture
def switch(clock: FakeClock) -> SwitchableStore:
    return SwitchableStore(clock)


def test_an_outage_costs_three_calls_then_none_until_the_probe(
    clock: FakeClock, switch: SwitchableStore
) -> None:
    events: list[Event] = []
    guard = StoreGuard(switch, on_store_error="fail_open", clock=clock, listeners=[events.append])
    assert guard.apply(ONCE, "k", once(1000)).down is None
    switch.down = True
    results = [guard.apply(ONCE, "k", once(1000)) for _ in range(10)]
    assert all(r.down is not None and r.value is None for r in results)
    assert switch.calls == 1 + 3, "three failures open the breaker; the rest never reach it"
    assert guard.failures == 3 and guard.short_circuits == 7 and guard.degraded == 10
    assert isinstance(results[-1].down.error, CircuitOpenError)  # type: ignore[union-attr]
    assert guard.state == "down" and [e.kind for e in events] == ["store_down"]

    clock.advance(1.0)  # the open duration: one probe, which fails; open time doubles
    assert guard.apply(ONCE, "k", once(1000)).down is not None
    assert switch.calls == 5
    clock.advance(1.0)
    guard.apply(ONCE, "k", once(1000))
    assert switch.calls == 5, "still open (2 s now)"

    switch.down = False
    clock.advance(1.0)
    assert guard.apply(ONCE, "x", once(1000)).down is None, "the probe succeeds: back by itself"
    assert guard.snapshot()["state"] == "up" and guard.outages == 1 and guard.recoveries == 1
    assert [e.kind for e in events] == ["store_down", "store_up"]
    assert events[1].figures["down_for"] == pytest.approx(3.0)
    assert events[0].figures["store"] == "switch://test" and "refused" in events[0].reason


async def test_async_shell_follows_the_same_rules(
    clock: FakeClock, switch: SwitchableStore
) -> None:
    guard = StoreGuard(switch, on_store_error="fail_closed", clock=clock)
    switch.down = True
    results = [await guard.apply_async(ONCE, "k", once(1000)) for _ in range(5)]
    assert all(r.down is not None and r.down.mode == "fail_closed" for r in results)
    assert switch.calls == 3
    switch.down = False
    clock.advance(1.0)
    assert (await guard.apply_async(ONCE, "k", once(1000))).value == (True, 1000)
    assert guard.snapshot()["state"] == "up"


class HeldStore(SwitchableStore):
    """Calls on key ``"slow"`` pass the check, then wait for ``gate``: a call in flight."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        self._check(op)
        if key == "slow":
            self.entered.set()
            await self.gate.wait()
        return self.inner.apply(op, key, args)


async def test_a_call_running_when_the_store_failed_does_not_end_the_outage(
    clock: FakeClock,
) -> None:
    """As PostgreSQL shuts down backend by backend: one outage, not two."""
    store = HeldStore(clock)
    events: list[Event] = []
    guard = StoreGuard(store, on_store_error="fail_open", clock=clock, listeners=[events.append])
    straggler = asyncio.create_task(guard.apply_async(ONCE, "slow", once(1000)))
    await store.entered.wait()
    store.down = True
    assert (await guard.apply_async(ONCE, "k", once(1000))).down is not None
    store.gate.set()
    assert (await straggler).down is None  # its answer stands...
    assert guard.state == "down" and guard.recoveries == 0  # ...but it ends no outage
    store.down = False
    assert (await guard.apply_async(ONCE, "k", once(1000))).down is None
    assert guard.outages == 1 and guard.recoveries == 1
    assert [e.kind for e in events] == ["store_down", "store_up"]


def test_local_mode_answers_from_memory_with_the_local_args(
    clock: FakeClock, switch: SwitchableStore
) -> None:
    guard = StoreGuard(switch, on_store_error="local", clock=clock)
    switch.down = True
    store_args, local_args = [100, 60_000_000, 1, 1], [2, 60_000_000, 1, 1]
    answers = [guard.apply(FIXED, "c", store_args, local_args) for _ in range(3)]
    assert [a.value[1][0][0] for a in answers if a.value] == [True, True, False]
    assert all(a.down is not None for a in answers)


def test_a_bug_in_an_op_propagates_and_does_not_count(
    clock: FakeClock, switch: SwitchableStore
) -> None:
    guard = StoreGuard(switch, clock=clock)
    with pytest.raises(ValueError, match="invalid literal"):
        guard.apply(ONCE, "k", [1, "not-a-number", 1, 1])
    assert guard.failures == 0 and guard.state == "up"


def test_bad_mode_is_a_config_error(switch: SwitchableStore) -> None:
    with pytest.raises(ConfigError, match="on_store_error must be one of"):
        StoreGuard(switch, on_store_error="retry")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "allowed", "error"),
    [("fail_open", True, None), ("fail_closed", False, "fail_closed"), ("local", True, None)],
)
def test_frequency_never_raises_a_store_error(
    clock: FakeClock, switch: SwitchableStore, mode: str, allowed: bool, error: str | None
) -> None:
    limiter = Frequency(10, 60, store=switch, on_store_error=mode, clock=clock)  # type: ignore[arg-type]
    switch.down = True
    decisions = [limiter.allow("user") for _ in range(5)]
    assert all(d.allowed is allowed and d.degraded == mode for d in decisions)
    if error:
        with pytest.raises(Exception, match="fail_closed") as caught:
            limiter.call(lambda: None)
        assert isinstance(caught.value, LimitStoreUnavailableError)  # a RateLimitedError
        assert caught.value.kind == "store_unavailable"  # HTTP 503: the store's outage


class FrozenStore(SwitchableStore):
    """A store whose server can be frozen: ops then fail as a timed-out read does."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock, url="frozen://test")
        self.frozen = False

    def _check(self, op: Op[object]) -> None:
        if self.frozen:
            self.calls += 1
            try:
                raise TimeoutError("timed out reading the reply")
            except TimeoutError as exc:
                raise StoreTimeoutError(self.url, op.script) from exc
        super()._check(op)


def test_one_timed_out_call_opens_the_breaker_and_counts_its_callers(clock: FakeClock) -> None:
    store = FrozenStore(clock)
    events: list[Event] = []
    guard = StoreGuard(store, on_store_error="fail_open", clock=clock, listeners=[events.append])
    store.frozen = True
    first = guard.apply(ONCE, "k", once(1000), callers=16)
    assert first.down is not None and isinstance(first.down.error, StoreTimeoutError)
    assert guard.breaker.state.name == "OPEN", "a timeout proves the store down: no second wait"
    later = [guard.apply(ONCE, "k", once(1000)) for _ in range(5)]
    assert store.calls == 1 and all(isinstance(r.down.error, CircuitOpenError) for r in later)  # type: ignore[union-attr]
    assert guard.failures == 1 and guard.failed_callers == 16 and guard.short_circuits == 5
    assert guard.snapshot()["failed_callers"] == 16
    assert [e.kind for e in events] == ["store_down"] and events[0].figures["callers"] == 16

    store.frozen = False
    clock.advance(1.0)
    assert guard.apply(ONCE, "x", once(1000)).down is None and guard.state == "up"


def test_refused_connections_still_take_three_failures(
    clock: FakeClock, switch: SwitchableStore
) -> None:
    """Only a timeout opens at once: a refused connection costs nothing to find out again."""
    guard = StoreGuard(switch, on_store_error="fail_open", clock=clock)
    switch.down = True
    guard.apply(ONCE, "k", once(1000))
    assert guard.breaker.state.name == "CLOSED"
    guard.apply(ONCE, "k", once(1000))
    guard.apply(ONCE, "k", once(1000))
    assert guard.breaker.state.name == "OPEN" and guard.failures == 3


async def test_callers_that_gave_up_get_the_mode_answer_and_are_counted(
    clock: FakeClock,
) -> None:
    store = FrozenStore(clock)
    local = StoreGuard(store, on_store_error="local", clock=clock)
    took = await local.gave_up_async(ONCE, "k", once(1000), callers=3)
    assert took.value == (True, 1000), "the local store answered"
    assert isinstance(took.down.error, StoreTimeoutError)  # type: ignore[union-attr]
    assert isinstance(took.down.error.__cause__, TimeoutError)  # type: ignore[union-attr]
    assert local.failed_callers == 3 and local.degraded == 1 and local.failures == 0
    assert store.calls == 0, "giving up never touches the store"
    closed = StoreGuard(store, on_store_error="fail_closed", clock=clock)
    refused = await closed.gave_up_async(ONCE, "k", once(1000))
    assert refused.value is None and refused.down is not None
    assert refused.down.mode == "fail_closed"


def test_a_memory_store_is_called_directly_until_its_breaker_is_forced_open(
    clock: FakeClock,
) -> None:
    store = MemoryStore(clock=clock)
    guard = StoreGuard(store, on_store_error="fail_closed", clock=clock)
    first = guard.apply(ONCE, "k", once(1000))
    assert first.value == (True, 1000) and first.down is None
    assert guard.apply(ONCE, "k", once(1000)).value == (False, 1000)
    guard.breaker.force_open()  # an operator's action still holds
    down = guard.apply(ONCE, "k", once(1000)).down
    assert down is not None and isinstance(down.error, CircuitOpenError)
    assert guard.short_circuits == 1
    guard.breaker.force_closed()
    guard.breaker.reset()
    assert guard.apply(ONCE, "k", once(1000)).value == (False, 1000)
    assert guard.short_circuits == 1 and guard.failures == 0


def test_a_store_assigned_later_is_the_one_called(
    clock: FakeClock, switch: SwitchableStore
) -> None:
    first, second = MemoryStore(clock=clock), MemoryStore(clock=clock)
    guard = StoreGuard(first, on_store_error="fail_closed", clock=clock)
    guard.store = second  # a policy sharing another's store, as tests and users do
    assert guard.apply(ONCE, "k", once(1000)).value == (True, 1000)
    assert second.apply(ONCE, "k", once(1000)) == (False, 1000), "the op ran on the new store"
    assert first.apply(ONCE, "k", once(1000)) == (True, 1000), "the old store never saw it"
    guard.store = switch  # not in-process: calls go through the breaker again
    switch.down = True
    assert guard.apply(ONCE, "k", once(1000)).down is not None and guard.failures == 1
