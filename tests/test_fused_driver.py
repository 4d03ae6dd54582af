"""The fused async driver runs a pipeline's usual stages as the nested runners do.

``fused_async`` (one coroutine for a meter, gates, a retry and a timeout) must call the same
hooks, in the same order, with the same clock readings and outcomes, as the runners it stands
for nested one in another (``metered_async(gate_async(attempts_async(scoped_async(fn))))``).
Each case runs one scenario through both on a fake clock and compares the logs.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest

import floodwall as fw
from floodwall._core.admission import Gate
from floodwall._core.drivers import (
    Fused,
    Metered,
    attempts_async,
    fuse,
    fused_async,
    gate_async,
    gates_async,
    metered_async,
    scoped_async,
)
from floodwall._core.meter import Meter, Metering
from floodwall.backoff import Fixed

Log = list[tuple[Any, ...]]


class _Logged(Gate):
    """A gate that writes every hook call to ``log``; refuses when ``refuse`` is set."""

    kind = "logged"

    def __init__(self, name: str, clock: fw.FakeClock, log: Log, refuse: bool = False) -> None:
        self.name = name
        self.listeners = fw.Listeners()
        self._now = clock.monotonic
        self.log = log
        self.refuse = refuse

    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.log.append(("admit", self.name, now, args, tuple(kwargs.items())))
        if self.refuse:
            raise fw.RejectedError(self.name, f"{self.name} refuses", None)
        return f"permit-{self.name}"

    def record(
        self, permit: Any, now: float, duration: float, error: BaseException | None, result: Any
    ) -> None:
        kind = None if error is None else type(error).__name__
        self.log.append(("record", self.name, permit, now, duration, kind, result))


def _work(clock: fw.FakeClock, log: Log, failures: int, seconds: float) -> Callable[..., Any]:
    """A call that fails ``failures`` times (``ConnectionError``), then answers; each try takes
    ``seconds`` of the fake clock."""
    tries = [0]

    async def work(x: int, *, y: int = 0) -> int:
        tries[0] += 1
        log.append(("call", tries[0], clock.monotonic()))
        clock.advance(seconds)
        if tries[0] <= failures:
            raise ConnectionError(f"try {tries[0]}")
        return x + y

    return work


def _scenario(
    *, failures: int, refuse: bool = False, seconds: float = 0.01
) -> tuple[Callable[[bool], Awaitable[Any]], Log, Metering]:
    clock = fw.FakeClock()
    log: Log = []
    outer = _Logged("outer", clock, log)
    inner = _Logged("inner", clock, log, refuse=refuse)
    retry = fw.Retry("r", attempts=3, backoff=Fixed(0.0), clock=clock)
    timeout = fw.Timeout(5.0, clock=clock)
    metering = Metering(Meter(), lambda outcome, error: log.append(("rejected", outcome)))
    metered = Metered(metering, clock.monotonic, outer)
    work = _work(clock, log, failures, seconds)

    async def run(fused: bool) -> Any:
        if fused:
            plan = Fused(metered, inner, retry, timeout)
            return await fused_async(plan, work, 2, y=3)
        scoped = partial(scoped_async, timeout, work)
        attempted = partial(attempts_async, retry, scoped)
        gated = partial(gate_async, inner, attempted)
        return await metered_async(metered, gated, 2, y=3)

    return run, log, metering


def _outcome(fused: bool, **scenario: Any) -> tuple[Any, Log, list[int]]:
    run, log, metering = _scenario(**scenario)

    async def main() -> Any:
        try:
            return await run(fused)
        except Exception as exc:  # (the error is part of what is compared)
            return type(exc).__name__

    answer = asyncio.run(main())
    return answer, log, [tally.value for tally in metering.meter.latency_bins()]


@pytest.mark.parametrize(
    "scenario",
    [
        {"failures": 0},
        {"failures": 1},
        {"failures": 5},
        {"failures": 0, "refuse": True},
        {"failures": 0, "seconds": 6.0},
    ],
    ids=["success", "retried-once", "retries-exhausted", "inner-gate-refuses", "timed-out"],
)
def test_fused_driver_logs_what_the_nested_runners_log(scenario: dict[str, Any]) -> None:
    nested = _outcome(False, **scenario)
    fused = _outcome(True, **scenario)
    assert fused == nested
    assert nested[1]  # the scenario did run hooks


def test_usual_shape_is_fused_and_others_are_not() -> None:
    clock = fw.FakeClock()
    log: Log = []
    gate = _Logged("g", clock, log)
    retry = fw.Retry("r", clock=clock)
    timeout = fw.Timeout(1.0, clock=clock)
    assert fuse([(gate_async, gate), (attempts_async, retry), (scoped_async, timeout)])
    assert fuse([(gate_async, gate), (scoped_async, timeout)])
    assert fuse([(gates_async, (gate, gate)), (scoped_async, timeout)]) is None  # two gates
    assert fuse([(attempts_async, retry)]) is None  # one stage: nothing to fuse
    assert fuse([(scoped_async, timeout), (attempts_async, retry)]) is None  # out of order
    pipeline = fw.Pipeline(gate, retry, timeout)
    assert [runner for runner, _ in pipeline._async_stages] == [fused_async]
    fallback = fw.Fallback(0)
    mixed = fw.Pipeline(fallback, gate, retry, timeout)
    assert fused_async not in [runner for runner, _ in mixed._async_stages]


def test_fused_pipeline_binds_its_stage_and_stays_a_coroutine_function() -> None:
    clock = fw.FakeClock()
    gate = _Logged("g", clock, [])
    pipeline = fw.Pipeline(gate, fw.Retry("r", clock=clock))
    assert isinstance(pipeline.call_async, partial)  # the runner itself: no wrapping coroutine
    assert inspect.iscoroutinefunction(pipeline.call_async)

    @pipeline
    async def work(x: int) -> int:
        return x + 1

    assert inspect.iscoroutinefunction(work)
    assert asyncio.run(work(1)) == 2
    assert asyncio.run(pipeline.call_async(work.__wrapped__, 2)) == 3  # type: ignore[attr-defined]


def test_a_decorated_function_follows_the_resource_across_reloads() -> None:
    """A resource rebinds its stage on reload; what it decorated runs the new stages."""

    def document(attempts: int) -> dict[str, Any]:
        retry = {"attempts": attempts, "backoff": {"kind": "none"}}
        return {"resources": {"dep": {"retry": retry}}}

    registry = fw.config.Registry(document(2))
    resource = registry.get("dep")
    calls = [0]

    @resource  # type: ignore[untyped-decorator]  # (a registry resource is typed Any)
    async def flaky() -> int:
        calls[0] += 1
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        asyncio.run(flaky())
    assert calls[0] == 2
    registry.reload(document(3))
    calls[0] = 0
    with pytest.raises(ConnectionError):
        asyncio.run(flaky())
    assert calls[0] == 3


def test_a_subclass_with_its_own_call_async_keeps_it() -> None:
    class Mine(fw.Pipeline):
        async def call_async(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return "mine"

    clock = fw.FakeClock()
    mine = Mine(_Logged("g", clock, []), fw.Retry("r", clock=clock))
    assert asyncio.run(mine.call_async(_work(clock, [], 0, 0.0), 1)) == "mine"


class _Hooked(fw.Retry):
    """A retry whose ``after`` and ``end`` calls are written to ``log``."""

    def __init__(self, log: Log, **options: Any) -> None:
        super().__init__(attempts=2, backoff=Fixed(0), budget=None, **options)
        self.log = log

    def after(self, begun: Any, error: BaseException | None, result: Any) -> Any:
        self.log.append(("after", type(error).__name__ if error is not None else result))
        return super().after(begun, error, result)

    def end(self, begun: Any) -> None:
        self.log.append(("end",))
        super().end(begun)


@pytest.mark.parametrize("fused", [True, False])
def test_a_settled_begin_skips_after_and_end_for_a_success_only(fused: bool) -> None:
    """``Attempts.settled``: a retry begun with a bare start time and no ``retry_on_result``
    needs neither ``after`` for a success nor ``end``; a failure still goes to ``after``, and a
    retry judging results or begun with a deadline gets every hook."""

    async def run(policy: fw.Retry, fn: Callable[[], Awaitable[int]]) -> int:
        if fused:
            plan = Fused(None, None, policy, None)
            return await fused_async(plan, fn)
        return await attempts_async(policy, fn)

    async def ok() -> int:
        return 7

    tries = [0]

    async def flaky() -> int:
        tries[0] += 1
        if tries[0] == 1:
            raise ConnectionError("first")
        return 8

    log: Log = []
    plain = _Hooked(log)
    assert plain.settled is float
    assert asyncio.run(run(plain, ok)) == 7
    assert log == []
    assert asyncio.run(run(plain, flaky)) == 8
    assert log == [("after", "ConnectionError")]
    log.clear()
    judged = _Hooked(log, retry_on_result=lambda value: False)
    assert judged.settled is None
    assert asyncio.run(run(judged, ok)) == 7
    assert log == [("after", 7), ("end",)]
    log.clear()
    bounded = _Hooked(log, deadline=5.0)  # begun with a deadline to reset: not settled
    assert asyncio.run(run(bounded, ok)) == 7
    assert log == [("after", 7), ("end",)]


class _Untimed(_Logged):
    """A logged gate that declares it reads no time (as a bulkhead does)."""

    untimed = True


class _Counting(fw.FakeClock):
    """A fake clock that counts its readings."""

    readings = 0

    def monotonic(self) -> float:
        self.readings += 1
        return super().monotonic()


def test_an_untimed_gate_costs_no_clock_reading_and_gets_zero() -> None:
    """``Gate.untimed``: the fused driver passes 0.0 for ``now`` and ``duration`` and reads the
    gate's clock neither before nor after the call; a subclass overriding a hook reads it."""
    clock = _Counting()
    log: Log = []
    gate = _Untimed("u", clock, log)
    plan = Fused(None, gate, fw.Retry("r", clock=fw.FakeClock(), budget=None), None)
    assert not plan.timed
    assert asyncio.run(fused_async(plan, _work(fw.FakeClock(), [], 0, 0.0), 1)) == 1
    assert clock.readings == 0
    assert log[0][:3] == ("admit", "u", 0.0)
    assert log[1] == ("record", "u", "permit-u", 0.0, 0.0, None, 1)
    assert fw.Bulkhead.untimed

    class Watched(fw.Bulkhead):
        def record(self, permit: Any, now: float, *rest: Any) -> None:
            super().record(permit, now, *rest)

    assert not Watched.untimed
    assert Fused(None, Watched(), None, None).timed
    assert Fused(None, fw.Bulkhead(), None, None).timed is False


@pytest.mark.parametrize("fused", [True, False])
def test_a_breaker_lane_counts_the_meters_bin(fused: bool) -> None:
    """The meter's runners find a duration's bin once; the breaker's lane (``tally_in``)
    counts the same bin in its window, as its own bisection would."""
    clock = fw.FakeClock()
    breaker = fw.CircuitBreaker("b", minimum_calls=20, clock=clock)
    metering = Metering(Meter(), lambda outcome, error: None)
    metered = Metered(metering, clock.monotonic, breaker)
    durations = [0.0, 0.0004, 0.0123, 0.2, 0.2, 0.9]
    for seconds in durations:
        work = _work(clock, [], 0, seconds)
        if fused:
            asyncio.run(
                fused_async(Fused(metered, None, fw.Retry("r", clock=clock), None), work, 1)
            )
        else:
            asyncio.run(metered_async(metered, work, 1))
    assert breaker.lane is not None  # every success went through the lane
    meter_bins = [tally.value for tally in metering.meter.latency_bins()]
    assert list(breaker.metrics().histogram) == meter_bins
    assert breaker.metrics().calls == len(durations) == sum(meter_bins)
