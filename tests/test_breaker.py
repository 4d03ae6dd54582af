# mypy: disable-error-code="comparison-overlap,unreachable"
# (tests read a property before and after acting; mypy assumes it cannot change)
"""Circuit breaker: every transition and threshold, on a fake clock, in both shells."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

import floodwall as fw
from conftest import Shell
from floodwall import CircuitBreaker, CircuitOpenError, CircuitState, Event, FakeClock


class Boom(Exception):
    pass


class Business(Exception):
    pass


def ok(clock: FakeClock, duration: float = 0.0) -> Callable[[], str]:
    def fn() -> str:
        clock.advance(duration)
        return "ok"

    return fn


def fail(
    clock: FakeClock, duration: float = 0.0, exc: type[BaseException] = Boom
) -> Callable[[], str]:
    def fn() -> str:
        clock.advance(duration)
        raise exc("down")

    return fn


def run(shell: Shell, breaker: CircuitBreaker, fn: Callable[[], Any]) -> str:
    """Run once; return 'ok', the exception class name, or 'rejected'."""
    try:
        shell.run(breaker, fn)
    except CircuitOpenError:
        return "rejected"
    except BaseException as exc:
        return type(exc).__name__
    return "ok"


def make(clock: FakeClock, **options: Any) -> tuple[CircuitBreaker, list[Event]]:
    events: list[Event] = []
    options.setdefault("name", "dep")
    return CircuitBreaker(clock=clock, listeners=[events.append], **options), events


def test_defaults_are_the_seeds() -> None:
    b = CircuitBreaker()
    assert (
        b.options.failure_rate,
        b.options.minimum_calls,
        b.options.window,
        b.options.buckets,
    ) == (0.5, 20, 10.0, 10)
    assert (b.options.open_duration, b.options.half_open_calls) == (5.0, 1)
    assert b.state is CircuitState.CLOSED
    assert [int(s) for s in CircuitState][:3] == [0, 1, 2]  # stable metric numbers


def test_full_failure_below_minimum_calls_stays_closed(shell: Shell, clock: FakeClock) -> None:
    """The seeds' warning: 19 of 19 failing is not enough evidence with a volume threshold of 20."""
    b, events = make(clock)
    for _ in range(19):
        assert run(shell, b, fail(clock)) == "Boom"
    assert b.state is CircuitState.CLOSED
    assert events == []
    assert run(shell, b, fail(clock)) == "Boom"  # the 20th call trips it
    assert b.state is CircuitState.OPEN


def test_trips_at_failure_rate_with_reason_and_figures(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=10, failure_rate=0.5)
    for _ in range(5):
        run(shell, b, ok(clock))
    for _ in range(4):
        run(shell, b, fail(clock))
    assert b.state is CircuitState.CLOSED  # 9 calls < 10
    run(shell, b, fail(clock))  # 10 calls, 5 errors: 0.5 >= 0.5
    assert b.state is CircuitState.OPEN
    (event,) = events
    assert (event.kind, event.from_state, event.to_state) == ("state_change", "CLOSED", "OPEN")
    assert event.reason == "failure rate 0.50 >= 0.50 over 10 calls in 10s"
    assert event.figures["calls"] == 10
    assert event.figures["errors"] == 5


def test_below_failure_rate_stays_closed(shell: Shell, clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=10, failure_rate=0.5)
    for _ in range(6):
        run(shell, b, ok(clock))
    for _ in range(4):
        run(shell, b, fail(clock))
    assert b.state is CircuitState.CLOSED


def test_a_success_completing_minimum_calls_trips(shell: Shell, clock: FakeClock) -> None:
    """The rule is judged on the success that completes ``minimum_calls`` (resilience4j
    CircuitBreakerStateMachineTest: the state machine opens on the call reaching the minimum,
    whatever its outcome); before issue 18 a success never opened the breaker."""
    b, _ = make(clock, minimum_calls=4, failure_rate=0.5)
    for _ in range(3):
        run(shell, b, fail(clock))
    assert b.state is CircuitState.CLOSED  # 3 calls < 4
    run(shell, b, ok(clock))  # 4 calls, 75 % errors: opens
    assert b.state is CircuitState.OPEN


def test_open_rejects_with_retry_after_then_half_open(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=2, open_duration=5.0)
    run(shell, b, fail(clock))
    run(shell, b, fail(clock))
    assert b.state is CircuitState.OPEN
    clock.advance(2.0)
    with pytest.raises(CircuitOpenError) as info:
        shell.run(b, ok(clock))
    assert info.value.name == "dep"
    assert info.value.state is CircuitState.OPEN
    assert info.value.retry_after == pytest.approx(3.0)
    assert info.value.kind == "circuit_open"
    assert "'dep' rejected the call: circuit is OPEN (retry after 3.000s)" in str(info.value)
    assert b.rejected == 1
    clock.advance(3.0)
    assert b.state is CircuitState.HALF_OPEN  # reading the state makes the lazy transition
    assert [e.to_state for e in events] == ["OPEN", "HALF_OPEN"]


def test_single_probe_success_closes_with_fresh_window(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=2)
    run(shell, b, fail(clock))
    run(shell, b, fail(clock))
    clock.advance(5.0)
    assert run(shell, b, ok(clock)) == "ok"
    assert b.state is CircuitState.CLOSED
    assert b.metrics().calls == 0
    assert events[-1].reason == "1 half-open probe(s) succeeded"


def test_probe_failure_reopens(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=2)
    run(shell, b, fail(clock))
    run(shell, b, fail(clock))
    clock.advance(5.0)
    assert run(shell, b, fail(clock)) == "Boom"
    assert b.state is CircuitState.OPEN
    assert events[-1].from_state == "HALF_OPEN"
    assert events[-1].reason.startswith("half-open probe ended failure")


def test_half_open_admits_exactly_n_probes_all_must_succeed(clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=2, half_open_calls=3)
    for _ in range(2):
        run(Shell("sync"), b, fail(clock))
    clock.advance(5.0)
    permits = [b.acquire(clock.monotonic()) for _ in range(4)]
    assert [p >= 0 for p in permits] == [True, True, True, False]
    for permit in permits[:2]:
        b.on_outcome(permit, clock.monotonic(), fw.Kind.SUCCESS, 0.01)
    assert b.state is CircuitState.HALF_OPEN
    b.on_outcome(permits[2], clock.monotonic(), fw.Kind.SUCCESS, 0.01)
    assert b.state is CircuitState.CLOSED


def test_any_probe_failure_reopens_and_drops_the_others(clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=2, half_open_calls=2)
    for _ in range(2):
        run(Shell("sync"), b, fail(clock))
    clock.advance(5.0)
    first, second = b.acquire(clock.monotonic()), b.acquire(clock.monotonic())
    b.on_outcome(first, clock.monotonic(), fw.Kind.FAILURE, 0.01)
    assert b.state is CircuitState.OPEN
    b.on_outcome(second, clock.monotonic(), fw.Kind.SUCCESS, 0.01)  # stale: ignored
    assert b.state is CircuitState.OPEN


def test_ignored_probe_frees_its_slot(clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=2, ignore=Business)
    for _ in range(2):
        run(Shell("sync"), b, fail(clock))
    clock.advance(5.0)
    assert run(Shell("sync"), b, fail(clock, exc=Business)) == "Business"
    assert b.state is CircuitState.HALF_OPEN
    assert run(Shell("sync"), b, ok(clock)) == "ok"
    assert b.state is CircuitState.CLOSED


def test_hung_probe_cannot_wedge_the_breaker(clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=2, probe_timeout=10.0)
    for _ in range(2):
        run(Shell("sync"), b, fail(clock))
    clock.advance(5.0)
    hung = b.acquire(clock.monotonic())
    assert hung >= 0
    clock.advance(9.0)
    assert b.acquire(clock.monotonic()) < 0  # probe still out, not yet timed out
    clock.advance(1.0)
    assert b.acquire(clock.monotonic()) < 0  # times the probe out: back to OPEN
    assert b.state is CircuitState.OPEN
    assert "probe not back within 10s" in events[-1].reason
    clock.advance(5.0)
    assert run(Shell("sync"), b, ok(clock)) == "ok"
    assert b.state is CircuitState.CLOSED
    b.on_outcome(hung, clock.monotonic(), fw.Kind.FAILURE, 20.0)  # the late answer is dropped
    assert b.state is CircuitState.CLOSED


def test_open_duration_grows_on_repeated_trips_and_is_capped(clock: FakeClock) -> None:
    b, _ = make(
        clock, minimum_calls=2, open_duration=1.0, open_duration_growth=2.0, max_open_duration=5.0
    )
    sync = Shell("sync")
    for _ in range(2):
        run(sync, b, fail(clock))
    waits = []
    for _ in range(4):
        waits.append(b.retry_after(clock.monotonic()))
        clock.advance(b.retry_after(clock.monotonic()) or 0.0)
        assert run(sync, b, fail(clock)) == "Boom"  # the probe fails: reopen, longer
    waits.append(b.retry_after(clock.monotonic()))
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    clock.advance(5.0)
    run(sync, b, ok(clock))
    assert b.state is CircuitState.CLOSED
    for _ in range(2):
        run(sync, b, fail(clock))
    assert b.retry_after(clock.monotonic()) == 1.0  # closing resets the growth


def test_slow_call_rate_trips(shell: Shell, clock: FakeClock) -> None:
    b, events = make(
        clock, minimum_calls=4, failure_rate=None, slow_call_rate=0.5, slow_call_duration=1.0
    )
    run(shell, b, ok(clock, 0.1))
    run(shell, b, ok(clock, 0.1))
    run(shell, b, ok(clock, 1.5))
    assert b.state is CircuitState.CLOSED
    run(shell, b, ok(clock, 1.0))  # exactly the threshold is not slower than it
    assert b.state is CircuitState.CLOSED
    run(shell, b, ok(clock, 1.25))  # 5 calls, 2 slow: 0.4
    assert b.state is CircuitState.CLOSED
    run(shell, b, ok(clock, 1.5))  # 6 calls, 3 slow: 0.5
    assert b.state is CircuitState.OPEN
    assert events[-1].reason.startswith("slow-call rate 0.50 >= 0.50 (calls > 1s)")


def test_slow_probe_reopens_when_slow_rule_is_on(clock: FakeClock) -> None:
    b, _ = make(
        clock, minimum_calls=2, failure_rate=None, slow_call_rate=0.5, slow_call_duration=1.0
    )
    sync = Shell("sync")
    run(sync, b, ok(clock, 2.0))
    run(sync, b, ok(clock, 2.0))
    assert b.state is CircuitState.OPEN
    clock.advance(5.0)
    run(sync, b, ok(clock, 2.0))
    assert b.state is CircuitState.OPEN


def test_error_count_trips_at_high_volume(shell: Shell, clock: FakeClock) -> None:
    """Sentinel's absolute count: 5 errors trip even when they are 5 % of the traffic."""
    b, events = make(clock, minimum_calls=20, failure_rate=None, error_count=5)
    for _ in range(95):
        run(shell, b, ok(clock))
    for _ in range(4):
        run(shell, b, fail(clock))
    assert b.state is CircuitState.CLOSED
    run(shell, b, fail(clock))
    assert b.state is CircuitState.OPEN
    assert events[-1].reason == "error count 5 >= 5 over 100 calls in 10s"


def test_old_failures_leave_the_window(shell: Shell, clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=4)
    for _ in range(3):
        run(shell, b, fail(clock))
    clock.advance(10.0)  # all three buckets are out of the 10 s window
    run(shell, b, fail(clock))
    assert b.state is CircuitState.CLOSED
    assert b.metrics().calls == 1


def test_count_based_window(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, window_calls=10, minimum_calls=10)
    for _ in range(4):
        run(shell, b, fail(clock))
    for _ in range(10):
        run(shell, b, ok(clock))  # pushes the failures out of the last 10 calls
    clock.advance(3600)
    for _ in range(4):
        run(shell, b, fail(clock))
    assert b.state is CircuitState.CLOSED  # 4 of the last 10
    run(shell, b, fail(clock))
    assert b.state is CircuitState.OPEN
    assert "in the last 10 calls" in events[-1].reason


def test_what_counts(shell: Shell, clock: FakeClock) -> None:
    b, _ = make(
        clock,
        minimum_calls=100,
        record=(Boom, fw.RejectedError, TimeoutError),
        ignore=Business,
        failure_result=lambda r: r == 503,
    )
    run(shell, b, fail(clock))
    run(shell, b, fail(clock, exc=Business))
    run(shell, b, fail(clock, exc=KeyError))  # not in record: ignored
    run(shell, b, lambda: 503)
    run(shell, b, lambda: 200)
    run(shell, b, fail(clock, exc=lambda m: fw.TimeoutExceeded("t", 1.0)))  # type: ignore[arg-type]
    run(shell, b, fail(clock, exc=lambda m: fw.BulkheadFullError("bh", "full")))  # type: ignore[arg-type]
    snap = b.metrics()
    assert (snap.calls, snap.failures, snap.timeouts, snap.rejections) == (5, 2, 1, 1)
    assert snap.successes == 1
    assert snap.failure_rate == pytest.approx(0.8)


def test_cancellation_is_not_a_failure(clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=1)

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(b.call_async(cancelled))
    assert b.state is CircuitState.CLOSED
    assert b.metrics().calls == 0


def test_manual_controls(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=2)
    b.force_open()
    assert b.state is CircuitState.FORCED_OPEN
    with pytest.raises(CircuitOpenError) as info:
        shell.run(b, ok(clock))
    assert info.value.retry_after is None
    clock.advance(3600)
    assert run(shell, b, ok(clock)) == "rejected"  # forced open never half-opens
    b.force_closed()
    for _ in range(50):
        assert run(shell, b, fail(clock)) == "Boom"
    assert b.state is CircuitState.FORCED_CLOSED
    assert b.metrics().calls == 0  # forced closed counts nothing
    b.reset()
    assert b.state is CircuitState.CLOSED
    assert [(e.to_state, e.reason) for e in events] == [
        ("FORCED_OPEN", "forced open by operator"),
        ("FORCED_CLOSED", "forced closed by operator"),
        ("CLOSED", "reset by operator"),
    ]


def test_disabled_counts_and_reports_would_trip(shell: Shell, clock: FakeClock) -> None:
    b, events = make(clock, minimum_calls=2)
    b.disable()
    for _ in range(10):
        assert run(shell, b, fail(clock)) == "Boom"
    assert b.state is CircuitState.DISABLED
    assert b.metrics().calls == 10
    would = [e for e in events if e.kind == "would_trip"]
    assert len(would) == 1  # once per episode, not once per call
    assert would[0].reason.startswith("failure rate 1.00 >= 0.50")


def test_decorator_keeps_signature_and_binds_methods(clock: FakeClock) -> None:
    import inspect

    b = CircuitBreaker(clock=clock)

    @b
    def add(x: int, y: int = 1) -> int:
        """Adds."""
        return x + y

    class Client:
        @b
        def get(self, path: str) -> str:
            return f"GET {path}"

        @b
        async def aget(self, path: str) -> str:
            return f"AGET {path}"

    assert add(1) == 2
    assert add.__name__ == "add"
    assert add.__doc__ == "Adds."
    assert str(inspect.signature(add)) == "(x: 'int', y: 'int' = 1) -> 'int'"
    assert Client().get("/a") == "GET /a"
    assert inspect.iscoroutinefunction(Client.aget)
    assert asyncio.run(Client().aget("/b")) == "AGET /b"


def test_listener_errors_never_break_the_call(clock: FakeClock) -> None:
    def bad_listener(event: Event) -> None:
        raise RuntimeError("observer bug")

    b = CircuitBreaker(clock=clock, minimum_calls=1, listeners=[bad_listener])
    assert run(Shell("sync"), b, fail(clock)) == "Boom"
    assert b.state is CircuitState.OPEN
    assert b.listeners.errors == 1


def test_listener_may_read_the_breaker(clock: FakeClock) -> None:
    """Events are emitted after the lock is released: a listener can query the breaker."""
    seen: list[CircuitState] = []
    b = CircuitBreaker(clock=clock, minimum_calls=1)
    b.add_listener(lambda e: seen.append(b.state))
    run(Shell("sync"), b, fail(clock))
    assert seen == [CircuitState.OPEN]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"failure_rate": 1.5}, "failure_rate must be a number in (0, 1], got 1.5"),
        ({"minimum_calls": 0}, "minimum_calls must be an integer >= 1, got 0"),
        ({"open_duration": -1}, "open_duration must be a finite number of seconds > 0, got -1"),
        ({"slow_call_rate": 0.5}, "slow_call_rate=0.5 needs slow_call_duration"),
        ({"failure_rate": None}, "at least one of failure_rate, slow_call_rate, error_count"),
        ({"half_open_calls": 2.5}, "half_open_calls must be an integer >= 1, got 2.5"),
        ({"max_open_duration": 1.0}, "max_open_duration must be >= open_duration (5.0), got 1.0"),
    ],
)
def test_bad_options_name_the_field_and_value(options: dict[str, Any], message: str) -> None:
    with pytest.raises(fw.ConfigError) as info:
        CircuitBreaker(**options)
    assert message in str(info.value)


def test_describe() -> None:
    b = CircuitBreaker("payments", minimum_calls=10)
    assert b.describe() == (
        "CircuitBreaker('payments', failure_rate=0.5, minimum_calls=10, window=10s, "
        "open_duration=5s)"
    )


def test_thread_stress_loses_no_count() -> None:
    """8 threads × 10 000 calls through one breaker: every call is counted exactly once."""
    clock = FakeClock(0.5)  # time stands still: one bucket, nothing evicted
    b = CircuitBreaker(clock=clock, minimum_calls=1, failure_rate=1.0, window=1000.0)
    threads, calls = 8, 10_000
    barrier = threading.Barrier(threads)

    def ok_call() -> int:
        return 1

    def failing() -> int:
        raise Boom

    def worker(index: int) -> None:
        barrier.wait()
        for i in range(calls):
            if (i + index) % 10 == 0:
                with contextlib.suppress(Boom):
                    b.call(failing)
            else:
                b.call(ok_call)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    snap = b.metrics()
    assert snap.calls == threads * calls
    assert snap.failures == threads * calls // 10
    assert sum(snap.histogram) == threads * calls
    assert b.state is CircuitState.CLOSED


def test_thread_stress_many_buckets() -> None:
    """Same, with time moving so buckets rotate while threads are counting."""
    clock = FakeClock(0.0)
    b = CircuitBreaker(clock=clock, minimum_calls=1, failure_rate=1.0, window=100.0, buckets=100)
    threads, calls = 8, 5_000
    barrier = threading.Barrier(threads + 1)
    done = threading.Event()

    def worker() -> None:
        barrier.wait()
        for _ in range(calls):
            b.call(int)

    def ticker() -> None:
        barrier.wait()
        for _ in range(50):  # 50 s of fake time, inside the 100 s window
            clock.advance(1.0)
            if done.is_set():
                break

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    tick = threading.Thread(target=ticker)
    for t in [*pool, tick]:
        t.start()
    for t in pool:
        t.join()
    done.set()
    tick.join()
    assert b.metrics().calls == threads * calls


def test_many_async_tasks_share_one_breaker(clock: FakeClock) -> None:
    b = CircuitBreaker(clock=clock, minimum_calls=1000, failure_rate=1.0)

    async def work(i: int) -> int:
        await asyncio.sleep(0)
        if i % 4 == 0:
            raise Boom
        return i

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(b.call_async(work, i) for i in range(1000)), return_exceptions=True
        )

    results = asyncio.run(main())
    assert sum(isinstance(r, Boom) for r in results) == 250
    snap = b.metrics()
    assert (snap.calls, snap.failures) == (1000, 250)


def test_reconfigure_keeps_state_and_counts(clock: FakeClock) -> None:
    b, _ = make(clock, minimum_calls=10)
    sync = Shell("sync")
    for _ in range(4):
        run(sync, b, fail(clock))
    b.reconfigure(minimum_calls=5, failure_rate=0.6)
    assert b.metrics().calls == 4  # same window shape: the counts survive
    assert b.options.minimum_calls == 5
    run(sync, b, fail(clock))
    assert b.state is CircuitState.OPEN  # the new threshold applies at once
    b.reconfigure(window=20.0, open_duration=30.0)
    assert b.state is CircuitState.OPEN  # the state survives a reshaped window
    assert b.metrics().calls == 0
    with pytest.raises(fw.ConfigError, match="failure_rate must be a number in"):
        b.reconfigure(failure_rate=2.0)
    assert b.options.failure_rate == 0.6  # a bad change leaves everything as it was
    with pytest.raises(fw.ConfigError, match="unknown circuit breaker option"):
        b.reconfigure(threshold=3)
