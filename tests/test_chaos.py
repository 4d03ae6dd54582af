"""Fault injection policies (floodwall.chaos), driven by a FakeClock and seeded random draws."""

from __future__ import annotations

import asyncio
import math
import pickle
import random
import statistics

import pytest

import floodwall as fw
from floodwall.chaos import (
    CHAOS_ENV,
    ChaosException,
    ChaosHang,
    ChaosLatency,
    ChaosOptions,
    ChaosResult,
    InjectedFault,
    Latency,
    Schedule,
    chaos_allowed,
    chaos_from_spec,
)


@pytest.fixture(autouse=True)
def _no_chaos_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from a process that does not allow chaos."""
    monkeypatch.delenv(CHAOS_ENV, raising=False)


def answer() -> str:
    return "real"


async def answer_async() -> str:
    return "real"


# -- the gate: off unless the process allows it --------------------------------------------


def test_inert_without_the_flag(clock: fw.FakeClock) -> None:
    latency = ChaosLatency(5.0, clock=clock)
    assert not latency.allowed
    assert latency.call(answer) == "real"
    assert clock.sleeps == []
    assert latency.injected == 0 and latency.calls == 1
    assert "inert" in latency.describe()
    assert not latency.active


def test_enable_without_the_flag_is_refused_loudly(clock: fw.FakeClock) -> None:
    latency = ChaosLatency(5.0, enabled=False, clock=clock)
    with pytest.raises(fw.ConfigError, match=f"{CHAOS_ENV}=1"):
        latency.enable()
    with pytest.raises(fw.ConfigError, match="cannot be enabled"):
        latency.reconfigure(enabled=True)
    assert not latency.options.enabled
    latency.disable()  # always allowed


@pytest.mark.parametrize(("value", "allowed"), [("1", True), ("true", False), ("yes", False)])
def test_only_exactly_one_allows(
    monkeypatch: pytest.MonkeyPatch, value: str, allowed: bool
) -> None:
    monkeypatch.setenv(CHAOS_ENV, value)
    assert chaos_allowed() is allowed
    assert ChaosLatency(1.0).allowed is allowed


def test_explicit_allow_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHAOS_ENV, "1")
    assert not ChaosLatency(1.0, allow=False).allowed
    monkeypatch.delenv(CHAOS_ENV)
    assert ChaosLatency(1.0, allow=True).allowed


def test_environment_allows(monkeypatch: pytest.MonkeyPatch, clock: fw.FakeClock) -> None:
    monkeypatch.setenv(CHAOS_ENV, "1")
    latency = ChaosLatency(2.0, clock=clock)
    assert latency.call(answer) == "real"
    assert clock.sleeps == [2.0]


# -- the four faults ---------------------------------------------------------------------------


def test_latency_sync_waits_on_the_clock(clock: fw.FakeClock) -> None:
    latency = ChaosLatency(1.5, allow=True, clock=clock)
    start = clock.monotonic()
    assert latency.call(answer) == "real"
    assert clock.monotonic() - start == 1.5
    assert latency.injected == 1


async def test_latency_async_parks_until_time_moves(clock: fw.FakeClock) -> None:
    latency = ChaosLatency(3.0, allow=True, clock=clock)
    task = asyncio.create_task(latency.call_async(answer_async))
    await asyncio.sleep(0)
    assert not task.done()
    assert clock.pending_sleepers == 1
    clock.advance(2.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    assert await task == "real"


def test_latency_from_a_distribution(clock: fw.FakeClock) -> None:
    latency = ChaosLatency(Latency.uniform(0.1, 0.2), allow=True, clock=clock, rng=random.Random(7))
    for _ in range(50):
        latency.call(answer)
    assert len(clock.sleeps) == 50
    assert all(0.1 <= s <= 0.2 for s in clock.sleeps)
    assert len(set(clock.sleeps)) > 40


def test_distributions_sample_what_they_say() -> None:
    rng = random.Random(1)
    assert Latency.fixed(0.25).sample(rng) == 0.25
    expo = [Latency.exponential(0.1).sample(rng) for _ in range(20_000)]
    assert statistics.fmean(expo) == pytest.approx(0.1, rel=0.05)
    logn = Latency.lognormal(0.05, 0.5)
    draws = [logn.sample(rng) for _ in range(20_000)]
    assert statistics.median(draws) == pytest.approx(0.05, rel=0.05)
    assert statistics.fmean(draws) == pytest.approx(logn.mean, rel=0.05)
    capped = Latency.exponential(1.0, cap=0.5)
    assert max(capped.sample(rng) for _ in range(1000)) == 0.5
    assert str(Latency.lognormal(0.05, 0.5)) == "lognormal(median 0.05s, sigma 0.5)"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Latency.fixed(-1), "latency must be a finite number of seconds >= 0"),
        (lambda: Latency.exponential(0), "latency must be a finite number of seconds > 0"),
        (lambda: Latency.uniform(0.2, 0.1), "high must be >= low"),
        (lambda: Latency.lognormal(0.1, -1), "sigma must be"),
        (lambda: Latency.fixed(math.inf), "finite"),
        (lambda: ChaosHang(0), "duration must be"),
    ],
)
def test_bad_options_name_themselves(build: object, message: str) -> None:
    with pytest.raises(fw.ConfigError, match=message):
        build()  # type: ignore[operator]


def test_exception_is_a_network_failure(clock: fw.FakeClock) -> None:
    boom = ChaosException(allow=True, clock=clock, name="pay.chaos")
    with pytest.raises(InjectedFault) as caught:
        boom.call(answer)
    error = caught.value
    assert isinstance(error, ConnectionError)
    assert isinstance(error, fw.FloodwallError)
    assert error.name == "pay.chaos"
    assert str(error) == "'pay.chaos' injected a fault: injected fault"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is InjectedFault and str(copy) == str(error)


async def test_exception_of_my_choice(clock: fw.FakeClock) -> None:
    boom = ChaosException(lambda: KeyError("gone"), allow=True, clock=clock)
    with pytest.raises(KeyError, match="gone"):
        await boom.call_async(answer_async)
    with pytest.raises(fw.ConfigError, match="exception must be"):
        ChaosException("nope", allow=True)  # type: ignore[arg-type]


async def test_result_answers_instead_of_calling(clock: fw.FakeClock) -> None:
    called: list[int] = []

    def real() -> dict[str, int]:
        called.append(1)
        return {"status": 200}

    answer_503 = ChaosResult({"status": 503}, allow=True, clock=clock)
    assert answer_503.call(real) == {"status": 503}
    fresh = ChaosResult(factory=lambda: {"status": 503}, allow=True, clock=clock)
    first, second = fresh.call(real), fresh.call(real)
    assert first == second and first is not second
    assert called == []

    async def real_async() -> dict[str, int]:
        return real()

    assert await answer_503.call_async(real_async) == {"status": 503}
    with pytest.raises(fw.ConfigError, match="exactly one of value"):
        ChaosResult(allow=True)


async def test_hang_is_ended_by_a_timeout(clock: fw.FakeClock) -> None:
    hang = ChaosHang(allow=True, clock=clock)
    guarded = fw.Pipeline(fw.Timeout(0.5, clock=clock), hang)
    task = asyncio.create_task(guarded.call_async(answer_async))
    await asyncio.sleep(0)
    clock.advance(0.5)
    with pytest.raises(fw.TimeoutExceeded):
        await task


def test_hang_gives_up_after_its_duration(clock: fw.FakeClock) -> None:
    hang = ChaosHang(30.0, allow=True, clock=clock)
    with pytest.raises(InjectedFault, match="hung for 30s"):
        hang.call(answer)
    assert clock.sleeps == [30.0]


# -- rate, schedule, switch ------------------------------------------------------------------


def test_decide_is_a_pure_table(clock: fw.FakeClock) -> None:
    policy = ChaosException(
        rate=0.3, schedule=Schedule.between(10, 20), allow=True, clock=clock, origin=100.0
    )
    assert policy.decide(110.0, 0.29)
    assert not policy.decide(110.0, 0.3)  # draw < rate, strictly
    assert not policy.decide(109.99, 0.0)  # before the window
    assert policy.decide(119.99, 0.0)
    assert not policy.decide(120.0, 0.0)  # windows are half-open
    policy.disable()
    assert not policy.decide(110.0, 0.0)
    assert not ChaosException(rate=1.0, clock=clock).decide(0.0, 0.0)  # not allowed


def test_rate_hits_that_share_of_calls(clock: fw.FakeClock) -> None:
    policy = ChaosResult("x", rate=0.3, allow=True, clock=clock, rng=random.Random(3))
    hits = sum(policy.call(answer) == "x" for _ in range(10_000))
    assert 2800 <= hits <= 3200
    assert policy.injected == hits and policy.calls == 10_000
    never = ChaosResult("x", rate=0.0, allow=True, clock=clock)
    assert all(never.call(answer) == "real" for _ in range(100))


def test_seeded_draws_repeat() -> None:
    def run() -> list[str]:
        policy = ChaosResult("x", rate=0.5, allow=True, rng=random.Random(11))
        return [policy.call(answer) for _ in range(50)]

    assert run() == run()


def test_schedule_counts_from_the_origin(clock: fw.FakeClock) -> None:
    policy = ChaosResult("x", schedule=Schedule.between(10, 40), allow=True, clock=clock)
    assert policy.call(answer) == "real"
    clock.advance(10)
    assert policy.active and policy.call(answer) == "x"
    clock.advance(30)
    assert policy.call(answer) == "real"
    policy.restart()
    clock.advance(10)
    assert policy.call(answer) == "x"


def test_schedule_shapes() -> None:
    assert Schedule.always().active(1e9)
    assert not Schedule.after(5).active(4.99) and Schedule.after(5).active(5)
    periodic = Schedule.periodic(every=60, for_=10, offset=5)
    assert [periodic.active(t) for t in (4, 5, 14.9, 15, 65, 136)] == [
        False,
        True,
        True,
        False,
        True,
        False,
    ]
    two = Schedule(((0, 1), (2, 3)))
    assert [two.active(t) for t in (0.5, 1.5, 2.5, 3.5, -1)] == [True, False, True, False, False]
    assert str(two) == "[0s..1s, 2s..3s]"


@pytest.mark.parametrize(
    ("windows", "period", "message"),
    [
        (((5, 5),), None, "0 <= start < end"),
        (((-1, 5),), None, "0 <= start < end"),
        (((0, 5), (4, 6)), None, "starts before the previous window ends"),
        (((0, 5),), 4.0, "must end within the period"),
        (((0, 5),), 0.0, "period must be"),
    ],
)
def test_bad_schedules(
    windows: tuple[tuple[float, float], ...], period: float | None, message: str
) -> None:
    with pytest.raises(fw.ConfigError, match=message):
        Schedule(windows, period)


def test_switch_and_live_reconfigure(clock: fw.FakeClock) -> None:
    seen: list[fw.Event] = []
    policy = ChaosResult("x", allow=True, clock=clock, listeners=[seen.append], name="c")
    assert policy.call(answer) == "x"
    policy.disable()
    assert policy.call(answer) == "real"
    policy.enable()
    policy.reconfigure(rate=0.0)
    assert policy.call(answer) == "real"
    before = policy.options
    with pytest.raises(fw.ConfigError, match=r"rate must be a number in \[0, 1\], got 2"):
        policy.reconfigure(rate=2)
    with pytest.raises(fw.ConfigError, match="unknown chaos options"):
        policy.reconfigure(delay=3)
    assert policy.options is before
    kinds = [e.kind for e in seen]
    assert kinds == ["injected", "chaos_disabled", "chaos_enabled", "chaos_reconfigured"]
    assert seen[0].figures["fault"] == "result" and seen[0].name == "c"


def test_options_are_frozen_and_validated() -> None:
    options = ChaosOptions(rate=0.5)
    with pytest.raises(AttributeError):
        options.rate = 1.0  # type: ignore[misc]
    with pytest.raises(fw.ConfigError, match="enabled must be true or false"):
        ChaosOptions(enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(fw.ConfigError, match="schedule must be a Schedule"):
        ChaosOptions(schedule=[(0, 1)])  # type: ignore[arg-type]


# -- composition -----------------------------------------------------------------------------


def test_a_fallback_answers_for_an_injected_fault(clock: fw.FakeClock) -> None:
    pipeline = fw.Pipeline(fw.Fallback(value="fallback"), ChaosException(allow=True, clock=clock))
    assert pipeline.call(answer) == "fallback"


def test_retries_treat_injected_faults_as_transient(clock: fw.FakeClock) -> None:
    boom = ChaosException(rate=0.5, allow=True, clock=clock, rng=random.Random(2))
    retry = fw.Retry(attempts=10, budget=None, clock=clock)
    results = [fw.Pipeline(retry, boom).call(answer) for _ in range(20)]
    assert results == ["real"] * 20
    assert retry.retries > 0


def test_a_breaker_opens_on_injected_faults(clock: fw.FakeClock) -> None:
    breaker = fw.CircuitBreaker("dep", minimum_calls=5, clock=clock)
    pipeline = fw.Pipeline(breaker, ChaosException(allow=True, clock=clock))
    for _ in range(5):
        with pytest.raises(InjectedFault):
            pipeline.call(answer)
    assert breaker.state is fw.CircuitState.OPEN


async def test_decorator_keeps_the_function(clock: fw.FakeClock) -> None:
    slow = ChaosLatency(0.0, allow=True, clock=clock)

    @slow
    def double(x: int) -> int:
        return 2 * x

    @slow
    async def triple(x: int) -> int:
        return 3 * x

    assert double(2) == 4
    assert await triple(2) == 6
    assert double.__name__ == "double"
    assert slow.injected == 2


# -- the builder -----------------------------------------------------------------------------


def test_from_spec_builds_each_fault(clock: fw.FakeClock) -> None:
    latency = chaos_from_spec("a", {"latency": 2.0, "schedule": [[1, None]]}, allow=True)
    assert isinstance(latency, ChaosLatency)
    assert latency.options.schedule == Schedule(((1.0, math.inf),))
    boom = chaos_from_spec("b", {"exception": True, "rate": 0.3})
    assert isinstance(boom, ChaosException) and boom.options.rate == 0.3
    result = chaos_from_spec("c", {"result": {"status": 503}, "enabled": False}, allow=True)
    assert isinstance(result, ChaosResult) and not result.options.enabled
    hang = chaos_from_spec("d", {"hang": 10, "schedule": [[0, 5]], "period": 60})
    assert isinstance(hang, ChaosHang) and hang.duration == 10
    assert hang.options.schedule == Schedule(((0.0, 5.0),), 60.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "give exactly one fault"),
        ({"latency": 1, "hang": 2}, "give exactly one fault"),
        ({"latency": 1, "rat": 0.5}, r"unknown chaos keys \['rat'\]"),
        ({"latency": 1, "schedule": [[1]]}, r"schedule\[0\] must be \[start, end\]"),
        ({"latency": 1, "schedule": [[-1, 2]]}, r"schedule\[0\] start must be"),
        ({"latency": 1, "period": 5}, "period needs a schedule"),
        ({"latency": 1, "rate": 1.5}, "rate must be a number in"),
    ],
)
def test_from_spec_errors(spec: dict[str, object], message: str) -> None:
    with pytest.raises(fw.ConfigError, match=message):
        chaos_from_spec("x", spec, allow=True)
