"""One contract for the isolation, adaptive, chaos and degradation policies, in both worlds.

Each policy runs through the sync and the async driver (the ``shell`` fixture) with the same
expectations: a passed call returns its value and leaves nothing held, a refused call raises
the policy's typed error without running the function, and the protocol class is the one its
docstring names (no policy writes its own ``call`` body).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import floodwall as fw
from conftest import Shell
from floodwall._core.admission import Flow, Gate
from floodwall.adaptive import AdaptiveLimiter, BBRLimiter, ClientThrottle, FixedLimit, LoadShedder
from floodwall.chaos import ChaosException, ChaosHang, ChaosLatency, ChaosResult, InjectedFault
from floodwall.degrade import LevelGate, LevelLimiter, Levels, PriorityGate, SampledDrop
from floodwall.ratelimit import TokenBucket


class _Zero(random.Random):
    """Every draw is 0.0: a throttle refuses as soon as p_reject > 0."""

    def random(self) -> float:
        return 0.0


@dataclass
class Case:
    """``build()`` -> the policy and a function that makes it refuse (or ``None``)."""

    name: str
    build: Callable[[fw.FakeClock], tuple[fw.Policy, Callable[[], Any] | None]]
    error: type[BaseException] = fw.RejectedError
    held: Callable[[Any], int] = lambda policy: 0


def _bulkhead(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    bulkhead = fw.Bulkhead(max_concurrent=1, clock=clock)
    return bulkhead, bulkhead.acquire


def _adaptive(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    limiter = AdaptiveLimiter(FixedLimit(1), clock=clock)
    return limiter, limiter.acquire


def _shedder(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    shedder = LoadShedder(AdaptiveLimiter(FixedLimit(1), clock=clock), clock=clock)
    return shedder, shedder.admit


def _bbr(clock: fw.FakeClock) -> tuple[fw.Policy, None]:
    return BBRLimiter(cpu=lambda: 0.1, clock=clock), None


def _throttle(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    throttle = ClientThrottle(rng=_Zero(), clock=clock)

    def refuse() -> None:
        for _ in range(10):  # ten requests, no accepts: p_reject = 10/11
            throttle.attempt(clock.monotonic(), 1.0)

    return throttle, refuse


def _level_gate(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    levels = Levels(clock=clock)
    return LevelGate(levels, 3), lambda: levels.shed(3)


def _priority(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    gate = PriorityGate(10, clock=clock)
    return gate.for_level(3), lambda: [gate.try_enter(1) for _ in range(7)]


def _level_limiter(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    limiter = LevelLimiter(TokenBucket(10, burst=9, clock=clock))
    return limiter.for_level(2), lambda: [limiter.acquire(1) for _ in range(9)]


def _chaos_exception(clock: fw.FakeClock) -> tuple[fw.Policy, Callable[[], Any]]:
    chaos = ChaosException(allow=True, enabled=False, clock=clock)
    return chaos, chaos.enable


def _sampled(clock: fw.FakeClock) -> tuple[fw.Policy, None]:
    return SampledDrop(0.0, clock=clock), None


CASES = [
    Case("bulkhead", _bulkhead, fw.BulkheadFullError, lambda p: p.in_flight),
    Case("adaptive", _adaptive, fw.OverloadedError, lambda p: p.inflight),
    Case("shedder", _shedder, fw.OverloadedError, lambda p: p.inflight),
    Case("bbr", _bbr, fw.OverloadedError, lambda p: p.inflight),
    Case("throttle", _throttle, fw.OverloadedError),
    Case("level_gate", _level_gate, fw.DegradedError),
    Case("priority", _priority, fw.BulkheadFullError, lambda p: p.owner.in_flight),
    Case("level_limiter", _level_limiter, fw.RateLimitedError),
    Case("chaos_exception", _chaos_exception, InjectedFault),
    Case("sampled", _sampled),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_passed_call_returns_and_leaves_nothing_held(case: Case, shell: Shell) -> None:
    policy, _ = case.build(fw.FakeClock())
    assert isinstance(policy, Gate | Flow)
    assert "call" not in type(policy).__dict__ and "call_async" not in type(policy).__dict__
    assert shell.run(policy, lambda: 42) == 42
    assert case.held(policy) == 0

    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        shell.run(policy, fails)
    assert case.held(policy) == 0


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name not in ("bbr", "sampled")], ids=lambda case: case.name
)
def test_a_refused_call_raises_the_typed_error_without_running(case: Case, shell: Shell) -> None:
    policy, refuse = case.build(fw.FakeClock())
    assert refuse is not None
    refuse()
    ran: list[int] = []
    with pytest.raises(case.error):
        shell.run(policy, lambda: ran.append(1))
    assert ran == []


def test_chaos_latency_and_hang_wait_on_the_clock_in_both_worlds(shell: Shell) -> None:
    clock = fw.FakeClock()
    latency = ChaosLatency(0.25, allow=True, clock=clock)
    hang = ChaosHang(3.0, allow=True, clock=clock)
    if shell.kind == "async":  # an async sleeper waits until the test moves time
        clock = _SelfAdvancing()
        latency.clock = hang.clock = clock
    assert shell.run(latency, lambda: "late") == "late"
    ran: list[int] = []
    with pytest.raises(InjectedFault, match="hung for 3s"):
        shell.run(hang, lambda: ran.append(1))
    assert ran == []
    assert clock.sleeps == [0.25, 3.0]


class _SelfAdvancing(fw.FakeClock):
    """A fake clock whose async sleeps move it (for one-task tests)."""

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def test_answers_instead_of_the_call_in_both_worlds(shell: Shell) -> None:
    ran: list[int] = []
    result = ChaosResult({"status": 503}, allow=True)
    assert shell.run(result, lambda: ran.append(1)) == {"status": 503}
    dropped = SampledDrop(1.0, on_drop="dropped")
    assert shell.run(dropped, lambda: ran.append(1)) == "dropped"
    assert ran == []
    assert (dropped.dropped, dropped.passed) == (1, 0)


async def test_an_async_drop_factory_is_awaited_only_in_async_calls() -> None:
    async def answer() -> str:
        return "cached"

    dropped = SampledDrop(1.0, drop_factory=answer)

    async def never() -> str:
        raise AssertionError("dropped calls do not run")

    assert await dropped.call_async(never) == "cached"
    pending: Any = dropped.call(lambda: "x")  # the sync shell hands the value back as is
    assert await pending == "cached"


def test_a_throttle_counts_answers_as_accepts_but_not_backend_rejections(shell: Shell) -> None:
    clock = fw.FakeClock()
    throttle = ClientThrottle(clock=clock)
    shell.run(throttle, lambda: 1)

    def refused() -> None:
        raise fw.OverloadedError("backend", "busy", None)

    def broken() -> None:
        raise ValueError("answered, with an error")

    with pytest.raises(fw.OverloadedError):
        shell.run(throttle, refused)
    with pytest.raises(ValueError, match="answered"):
        shell.run(throttle, broken)
    assert throttle.counts(clock.monotonic()) == (3, 2)


def test_gates_in_a_pipeline_record_a_later_refusal_in_both_worlds(shell: Shell) -> None:
    clock = fw.FakeClock()
    bulkhead = fw.Bulkhead(max_concurrent=1, clock=clock)
    limiter = AdaptiveLimiter(FixedLimit(1), clock=clock)
    levels = Levels(clock=clock)
    levels.shed(3)
    pipeline = fw.Pipeline(bulkhead, limiter, LevelGate(levels, 3))
    with pytest.raises(fw.DegradedError):
        shell.run(pipeline, lambda: 1)
    assert (bulkhead.in_flight, limiter.inflight) == (0, 0)  # both gave back what they took
    levels.clear("level:3")
    assert shell.run(pipeline, lambda: 2) == 2
    assert (bulkhead.in_flight, limiter.inflight) == (0, 0)
