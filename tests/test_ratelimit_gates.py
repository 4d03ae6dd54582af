"""Every rate limiter is a gate run by the two drivers: one contract, both worlds.

No limiter writes a ``call``/``call_async`` body: both are the drivers'. A trace of calls gets
the same answers through either shell, and the same answers the limiter's own ``acquire`` gives
on a twin limiter; ``max_wait`` pacing sleeps the same sleeps; the store-backed gates make the
same round trips. The steps they raise are held to their contracts at the end: a wait generator
closed when its step fails, one lease in flight for concurrent threads and tasks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import floodwall as fw
from conftest import Shell, SwitchableStore
from floodwall._core.admission import Gate
from floodwall._core.flight import LANDED, Flight, Flights
from floodwall._core.pending import settle, settle_async, start
from floodwall._core.steps import FlowSteps, Sleep, Step, Wait
from floodwall.ratelimit import (
    GCRA,
    FixedWindow,
    Keyed,
    LeakyBucket,
    Multi,
    RateLimiter,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
    WarmUp,
)
from floodwall.shared import GlobalLimiter, LeasedLimiter, TimeSliceLimiter
from floodwall.shared.frequency import Frequency

GATES = [
    FixedWindow,
    SlidingLog,
    SlidingWindowCounter,
    LeakyBucket,
    TokenBucket,
    GCRA,
    WarmUp,
    Multi,
    Keyed,
    GlobalLimiter,
    LeasedLimiter,
    TimeSliceLimiter,
    Frequency,
]


@pytest.mark.parametrize("cls", GATES, ids=lambda cls: cls.__name__)
def test_every_limiter_is_a_gate_and_writes_no_call_body(cls: type[Any]) -> None:
    assert issubclass(cls, Gate)
    assert cls.call is Gate.call
    assert cls.call_async is Gate.call_async


LOCAL: dict[str, Callable[[fw.FakeClock], RateLimiter[Any]]] = {
    "fixed": lambda clock: FixedWindow("3/s", clock=clock),
    "sliding_log": lambda clock: SlidingLog("3/s", clock=clock),
    "sliding_counter": lambda clock: SlidingWindowCounter("3/s", clock=clock),
    "token": lambda clock: TokenBucket("3/s", burst=2, clock=clock),
    "gcra": lambda clock: GCRA("3/s", burst=2, clock=clock),
    "warmup": lambda clock: WarmUp("3/s", warmup=2.0, clock=clock),
    "multi": lambda clock: Multi.of("3/s", "5/2s", clock=clock),
    "keyed": lambda clock: Keyed(
        TokenBucket("3/s", burst=1, clock=clock), key=lambda user: user, max_keys=2
    ),
}
TRACE = [(0.0, "a"), (0.0, "a"), (0.0, "b"), (0.1, "a"), (0.1, "a"), (0.2, "c"), (0.3, "a")]
TRACE += [(0.05, "b"), (0.4, "a"), (0.0, "a"), (1.0, "a"), (0.0, "c"), (0.0, "a"), (0.0, "a")]
"""``(seconds to advance, user)``: bursts, refusals, refills, and a third key for ``Keyed``."""


def _echo(user: str) -> str:
    return user


async def _echo_async(user: str) -> str:
    return user


def _through(world: str, limiter: RateLimiter[Any], clock: fw.FakeClock) -> list[object]:
    answers: list[object] = []
    for step, user in TRACE:
        clock.advance(step)
        try:
            if world == "sync":
                answers.append(limiter.call(_echo, user))
            else:
                answers.append(asyncio.run(limiter.call_async(_echo_async, user)))
        except fw.RateLimitedError as exc:
            answers.append(("refused", exc.retry_after))
    return answers


def _by_acquire(limiter: RateLimiter[Any], clock: fw.FakeClock) -> list[object]:
    keyed = isinstance(limiter, Keyed)
    answers: list[object] = []
    for step, user in TRACE:
        clock.advance(step)
        result = limiter.acquire(user if keyed else None)
        retry = None if result.retry_after == float("inf") else result.retry_after
        answers.append(user if result else ("refused", retry))
    return answers


@pytest.mark.parametrize("world", ["sync", "async"])
@pytest.mark.parametrize("make", LOCAL.values(), ids=LOCAL.keys())
def test_a_trace_gets_the_answers_of_acquire_in_both_shells(
    make: Callable[[fw.FakeClock], RateLimiter[Any]], world: str
) -> None:
    clock, twin_clock = fw.FakeClock(), fw.FakeClock()
    got = _through(world, make(clock), clock)
    assert got == _by_acquire(make(twin_clock), twin_clock)
    refused = [a for a in got if isinstance(a, tuple)]
    assert 0 < len(refused) < len(got)  # the trace exercises both answers


async def _paced(limiter: Any, clock: fw.FakeClock, calls: int) -> list[float]:
    """Run ``calls`` calls through ``call_async``, moving the fake clock for their sleeps."""

    async def now() -> float:
        return clock.monotonic()

    async def all_calls() -> list[float]:
        return [await limiter.call_async(now) for _ in range(calls)]

    task = asyncio.ensure_future(all_calls())
    while not task.done():
        await asyncio.sleep(0)
        if clock.pending_sleepers:
            clock.advance(min(when - clock.monotonic() for when, _, _ in clock._sleepers))
    return await task


PACED: dict[str, Callable[[fw.FakeClock], RateLimiter[Any]]] = {
    "token": lambda clock: TokenBucket("2/s", burst=0, clock=clock, max_wait=1.0),
    "leaky": lambda clock: LeakyBucket("2/s", clock=clock, max_wait=1.0),
    "fixed": lambda clock: FixedWindow("2/s", clock=clock, max_wait=1.0),
}


@pytest.mark.parametrize("make", PACED.values(), ids=PACED.keys())
def test_max_wait_paces_alike_in_both_worlds(
    make: Callable[[fw.FakeClock], RateLimiter[Any]],
) -> None:
    clock, twin_clock = fw.FakeClock(), fw.FakeClock()
    limiter = make(clock)
    times = [limiter.call(clock.monotonic) for _ in range(5)]
    assert times == asyncio.run(_paced(make(twin_clock), twin_clock, 5))
    assert clock.sleeps == twin_clock.sleeps
    assert len(set(times)) > 1  # it did pace


@pytest.mark.parametrize("world", ["sync", "async"])
def test_a_global_limiter_paces_alike_in_both_worlds(world: str) -> None:
    clock = fw.FakeClock()
    store = SwitchableStore(clock)
    limiter = GlobalLimiter("fixed", "2/s", store=store, clock=clock, max_wait=1.0)
    if world == "sync":
        times = [limiter.call(clock.monotonic) for _ in range(5)]
    else:
        times = asyncio.run(_paced(limiter, clock, 5))
    assert times == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert store.calls == 7  # five admissions and two refusals, each one round trip
    assert limiter.rejected == 0  # a wait that ends in a permit is no refusal


STORE_GATES: dict[str, Callable[[fw.FakeClock, SwitchableStore], Any]] = {
    "global": lambda clock, store: GlobalLimiter("gcra", "3/s", burst=2, store=store, clock=clock),
    "leased": lambda clock, store: LeasedLimiter("gcra", "3/s", store=store, clock=clock, lease=2),
    "frequency": lambda clock, store: Frequency(3, 1.0, store=store, clock=clock),
}


@pytest.mark.parametrize("make", STORE_GATES.values(), ids=STORE_GATES.keys())
def test_store_backed_gates_admit_and_refuse_alike_in_both_shells(
    make: Callable[[fw.FakeClock, SwitchableStore], Any], shell: Shell
) -> None:
    clock = fw.FakeClock()
    store = SwitchableStore(clock)
    limiter = make(clock, store)
    answers = []
    for _ in range(4):
        try:
            answers.append(shell.run(limiter, lambda: "ok"))
        except fw.RateLimitedError as exc:
            answers.append("refused" if exc.retry_after and exc.retry_after > 0 else "no retry")
    assert answers == ["ok", "ok", "ok", "refused"]
    assert 0 < store.calls <= 4


def test_a_time_slice_gate_drops_at_its_drop_rate_in_both_shells(shell: Shell) -> None:
    clock = fw.FakeClock()
    limiter = TimeSliceLimiter("1/s", store=SwitchableStore(clock), clock=clock, background=False)
    for _ in range(100):
        limiter.try_acquire()
    clock.advance(limiter.slice_length)
    assert limiter.sync() == pytest.approx(0.9, abs=0.01)
    limiter._drop = 1.0  # the elected rate when the store is down and fail_closed
    with pytest.raises(fw.RateLimitedError):
        shell.run(limiter, lambda: "never")


# -- the steps the gates raise ------------------------------------------------------------------


class _Boom(Step):
    def run(self, call: Callable[[], Any]) -> Any:
        raise TimeoutError("the step failed")

    async def arun(self, call: Callable[[], Any]) -> Any:
        raise TimeoutError("the step failed")


def test_a_wait_generator_is_closed_when_its_step_fails() -> None:
    closed: list[bool] = []

    def steps() -> FlowSteps:
        try:
            yield _Boom()
        finally:
            closed.append(True)
        return "unreachable"

    with pytest.raises(Wait) as raised:
        start(steps())
    with pytest.raises(TimeoutError):
        raised.value.step.run(lambda: None)
    assert closed == [True]


def test_settle_runs_a_generator_in_a_thread_or_a_task() -> None:
    clock = fw.FakeClock()

    def steps() -> FlowSteps:
        yield Sleep(clock, 0.0)
        return clock.sleeps

    assert settle(steps()) == [0.0]
    assert asyncio.run(settle_async(steps())) == [0.0, 0.0]


def test_one_flight_at_a_time_for_threads() -> None:
    flights = Flights()
    entered, release = threading.Event(), threading.Event()
    flown: list[object] = []

    class Slow(Step):
        def run(self, call: Callable[[], Any]) -> Any:
            entered.set()
            release.wait(5)
            return "leased"

    first = Flight(flights, "k", Slow())
    second = Flight(flights, "k", Slow())  # built before the first landed: it looks again
    thread = threading.Thread(target=lambda: flown.append(first.run(lambda: None)))
    thread.start()
    assert entered.wait(5)
    other = threading.Thread(target=lambda: flown.append(second.run(lambda: None)))
    other.start()
    release.set()
    thread.join(5)
    other.join(5)
    assert flown.count(LANDED) == 1
    assert flown.count("leased") == 1
    assert flights.landed == 1


async def test_one_flight_per_key_for_tasks() -> None:
    flights = Flights()
    gate = asyncio.Event()

    class Slow(Step):
        async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
            await gate.wait()
            return "leased"

    async def fly(key: str) -> object:
        return await Flight(flights, key, Slow()).arun(_no_call)

    first = asyncio.ensure_future(fly("k"))
    await asyncio.sleep(0)
    second, other_key = asyncio.ensure_future(fly("k")), asyncio.ensure_future(fly("j"))
    await asyncio.sleep(0)
    gate.set()
    assert [await first, await second, await other_key] == ["leased", LANDED, "leased"]


async def _no_call() -> None:
    raise AssertionError("a flight's step does not run the call")
