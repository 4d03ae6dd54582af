"""Dependency levels: the shedding controller's order and hysteresis, the automatic shedder on a
config Registry and on Levels, the level gate. All on a FakeClock."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.config import Registry
from floodwall.degrade import (
    AutoShedder,
    LevelGate,
    Levels,
    ShedController,
    ShedOptions,
    ShedState,
)
from floodwall.degrade.signals import (
    cpu_signal,
    limiter_signal,
    max_signal,
    queueing_signal,
    shed_rate_signal,
)

HOT, WARM, CALM = 1.5, 0.8, 0.2


def state(core: ShedController) -> ShedState:
    """The controller's state, read through a call (so mypy does not narrow it across steps)."""
    return core.state


def feed(core: ShedController, start: float, seconds: int, signal: float) -> list[Any]:
    """One reading per second for ``seconds``; the steps taken, with their times."""
    steps = []
    for t in range(seconds):
        step = core.observe(start + t, signal)
        if step is not None:
            steps.append((start + t, step.action, step.level))
    return steps


# -- the pure controller ----------------------------------------------------------------------


def test_sheds_level_3_first_then_level_2_one_step_per_streak() -> None:
    core = ShedController(ShedOptions(shed_after=2.0))
    assert state(core) is ShedState.NORMAL
    steps = feed(core, 0, 10, HOT)
    assert steps == [(2, "shed", 3), (4, "shed", 2)]
    assert state(core) is ShedState.SHED_2 and core.shed_levels == {2, 3}
    assert [int(s) for s in ShedState] == [0, 1, 2], "state numbers are stable for metrics"


def test_restores_level_2_first_after_sustained_calm() -> None:
    core = ShedController(ShedOptions(shed_after=1.0, restore_after=30.0))
    feed(core, 0, 3, HOT)
    assert state(core) is ShedState.SHED_2
    assert feed(core, 3, 29, CALM) == [], "29 s of calm is not enough"
    steps = feed(core, 32, 40, CALM)
    assert steps == [(33, "restore", 2), (63, "restore", 3)]
    assert state(core) is ShedState.NORMAL


def test_the_hysteresis_band_holds_the_state_and_breaks_streaks() -> None:
    core = ShedController(ShedOptions(shed_above=1.0, restore_below=0.7, shed_after=2.0))
    assert core.observe(0, HOT) is None
    assert core.observe(1, WARM) is None  # between the thresholds: the streak is broken
    assert core.observe(2, HOT) is None
    assert core.observe(3, HOT) is None
    assert core.observe(4, HOT) is not None, "2 s of a fresh streak"
    assert feed(core, 5, 100, WARM) == [], "in the band nothing is restored, ever"
    assert state(core) is ShedState.SHED_3


def test_a_nan_reading_holds() -> None:
    core = ShedController(ShedOptions(shed_after=1.0))
    core.observe(0, HOT)
    assert core.observe(1, math.nan) is None
    assert core.observe(2, HOT) is None, "the NaN broke the streak"
    assert core.observe(3, HOT) is not None


def test_flapping_doubles_the_restore_delay_up_to_the_cap_and_a_held_restore_resets_it() -> None:
    core = ShedController(
        ShedOptions(shed_after=0.0, restore_after=10.0, restore_growth=2.0, max_restore_after=25)
    )
    t = 0.0
    assert core.observe(t, HOT) is not None  # level 3 shed at once (shed_after 0)
    delays = []
    for _ in range(3):
        # calm until restored, then overloaded again right away: a flap
        while state(core) is not ShedState.NORMAL:
            t += 1
            core.observe(t, CALM)
        t += 1
        assert core.observe(t, HOT) is not None
        delays.append(core.restore_after)
    assert delays == [20.0, 25.0, 25.0]
    while state(core) is not ShedState.NORMAL:
        t += 1
        core.observe(t, CALM)
    feed(core, t + 1, 30, CALM)  # the restore held for a whole delay
    assert core.restore_after == 10.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([HOT, WARM, CALM, math.nan]), max_size=200))
def test_controller_invariants(readings: list[float]) -> None:
    """Against the model: one level per step; 3 before 2 on the way down, 2 before 3 on the
    way up; a shed only after shed_after of readings at or above the threshold; a restore only
    after restore_after of calm."""
    options = ShedOptions(shed_after=2.0, restore_after=5.0)
    core = ShedController(options)
    hot_since: float | None = None
    calm_since: float | None = None
    depth = 0
    for t, value in enumerate(readings):
        hot_since = (hot_since if hot_since is not None else t) if value == HOT else None
        calm_since = (calm_since if calm_since is not None else t) if value == CALM else None
        step = core.observe(t, value)
        if step is None:
            continue
        if step.action == "shed":
            assert step.level == (3, 2)[depth]
            assert hot_since is not None and t - hot_since >= options.shed_after
            depth += 1
            hot_since = t
        else:
            assert step.level == (3, 2)[depth - 1]
            assert calm_since is not None and t - calm_since >= options.restore_after
            depth -= 1
            calm_since = t
        assert int(core.state) == depth


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"restore_below": 1.0, "shed_above": 1.0}, "restore_below must be < shed_above"),
        ({"shed_after": -1}, "shed_after must be a finite number of seconds >= 0"),
        ({"restore_growth": 0.5}, "restore_growth must be a finite number >= 1"),
        ({"max_restore_after": 1.0}, "max_restore_after must be >= restore_after"),
    ],
)
def test_options_are_validated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(fw.ConfigError, match=message):
        ShedOptions(**options)


# -- the automatic shedder on a config Registry -----------------------------------------------

DOCUMENT = {
    "resources": {
        "payments": {"level": 1},
        "reviews": {"level": 2, "fallback": {"value": "no reviews"}},
        "badges": {"level": 3, "fallback": {"value": []}},
        "tracking": {"level": 3},
    }
}


class Load:
    """A signal the test sets by hand."""

    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value


def run_for(shedder: AutoShedder, clock: fw.FakeClock, seconds: int) -> None:
    for _ in range(seconds):
        shedder.tick()
        clock.advance(shedder.interval)


def test_auto_shedder_sheds_and_restores_registry_levels_in_order(clock: fw.FakeClock) -> None:
    events: list[fw.Event] = []
    registry = Registry(DOCUMENT, clock=clock)
    load = Load()
    shedder = AutoShedder(
        registry,
        load,
        shed_after=2,
        restore_after=10,
        lease=30,
        clock=clock,
        listeners=[events.append],
    )
    call = {name: registry.get(name) for name in ("payments", "reviews", "badges", "tracking")}
    load.value = 2.0
    run_for(shedder, clock, 3)
    assert state(shedder.core) is ShedState.SHED_3
    assert registry.is_shed(3) and not registry.is_shed(2)
    assert call["badges"].call(lambda: ["gold"]) == [], "a shed level answers its fallback"
    with pytest.raises(fw.DegradedError):
        call["tracking"].call(lambda: "sent")  # no fallback: DegradedError
    assert call["reviews"].call(lambda: "5 stars") == "5 stars"
    run_for(shedder, clock, 2)
    assert registry.is_shed(2) and registry.is_shed(3)
    assert call["reviews"].call(lambda: "5 stars") == "no reviews"
    assert call["payments"].call(lambda: "paid") == "paid", "level 1 is never shed"
    load.value = 0.1
    run_for(shedder, clock, 11)
    assert not registry.is_shed(2) and registry.is_shed(3), "level 2 comes back first"
    run_for(shedder, clock, 10)
    assert not registry.is_shed(3) and state(shedder.core) is ShedState.NORMAL
    kinds = [(e.kind, e.figures["level"]) for e in events if e.source == "auto_shedder"]
    assert kinds == [
        ("level_shed", 3),
        ("level_shed", 2),
        ("level_restored", 2),
        ("level_restored", 3),
    ]
    assert (shedder.sheds, shedder.restores) == (2, 2)
    assert registry.overrides() == []


def test_auto_sheds_are_leased_renewed_and_lapse_when_the_controller_dies(
    clock: fw.FakeClock,
) -> None:
    registry = Registry(DOCUMENT, clock=clock)
    load = Load()
    load.value = 2.0
    shedder = AutoShedder(registry, load, shed_after=0, lease=9, interval=1, clock=clock)
    run_for(shedder, clock, 60)
    assert registry.is_shed(3), "renewed every lease/3 while the controller runs"
    override = next(o for o in registry.overrides() if o.target == "level:3")
    assert override.until is not None and override.until - clock.monotonic() > 5
    clock.advance(9)  # the controller died: nobody renews
    assert not registry.is_shed(3) and not registry.is_shed(2)
    shedder.tick()  # back to life: the controller re-sheds what it wants shed
    assert registry.is_shed(3) and registry.is_shed(2)


def test_the_controller_never_touches_an_operators_shed(clock: fw.FakeClock) -> None:
    registry = Registry(DOCUMENT, clock=clock)
    load = Load()
    shedder = AutoShedder(registry, load, shed_after=0, restore_after=5, clock=clock)
    registry.shed(3, reason="flash sale tonight")  # the seeds: shed level 3 before the event
    load.value = 2.0
    run_for(shedder, clock, 3)
    assert registry.is_shed(2)
    load.value = 0.0
    run_for(shedder, clock, 20)
    assert state(shedder.core) is ShedState.NORMAL
    assert not registry.is_shed(2), "its own shed ended"
    assert registry.is_shed(3), "the operator's shed stays"
    (override,) = registry.overrides()
    assert override.reason == "flash sale tonight"


def test_an_operator_taking_over_a_level_keeps_it(clock: fw.FakeClock) -> None:
    registry = Registry(DOCUMENT, clock=clock)
    load = Load()
    load.value = 2.0
    shedder = AutoShedder(registry, load, shed_after=0, restore_after=5, clock=clock)
    run_for(shedder, clock, 2)
    registry.shed(3, reason="keep it off")  # replaces the controller's override
    load.value = 0.0
    run_for(shedder, clock, 30)
    assert registry.is_shed(3) and not registry.is_shed(2)


def test_release_ends_its_sheds(clock: fw.FakeClock) -> None:
    levels = Levels(clock=clock)
    load = Load()
    load.value = 2.0
    shedder = AutoShedder(levels, load, shed_after=0, clock=clock)
    run_for(shedder, clock, 3)
    assert levels.shed_levels == {2, 3}
    shedder.release()
    assert levels.shed_levels == frozenset() and state(shedder.core) is ShedState.NORMAL


def test_a_failing_signal_holds_and_is_counted(clock: fw.FakeClock) -> None:
    levels = Levels(clock=clock)
    events: list[fw.Event] = []

    def broken() -> float:
        raise OSError("no /proc")

    shedder = AutoShedder(levels, broken, clock=clock, listeners=[events.append])
    run_for(shedder, clock, 5)
    assert shedder.signal_errors == 5 and state(shedder.core) is ShedState.NORMAL
    assert math.isnan(shedder.snapshot()["signal"])
    assert events[0].kind == "signal_error"


async def test_run_async_ticks_on_the_clock(clock: fw.FakeClock) -> None:
    levels = Levels(clock=clock)
    load = Load()
    load.value = 2.0
    shedder = AutoShedder(levels, load, shed_after=2, interval=1, clock=clock)
    task = asyncio.create_task(shedder.run_async())
    for _ in range(5):
        await asyncio.sleep(0)
        clock.advance(1)
    await asyncio.sleep(0)
    assert levels.shed_levels == {2, 3}
    shedder.stop()
    clock.advance(1)
    await asyncio.wait_for(task, 1)


def test_auto_shedder_validates(clock: fw.FakeClock) -> None:
    with pytest.raises(fw.ConfigError, match="lease must be > interval"):
        AutoShedder(Levels(), Load(), interval=5, lease=5)
    with pytest.raises(fw.ConfigError, match="interval must be a finite number of seconds > 0"):
        AutoShedder(Levels(), Load(), interval=0)


# -- Levels and LevelGate ---------------------------------------------------------------------


def test_levels_ttl_and_gate(clock: fw.FakeClock, shell: Any) -> None:
    events: list[fw.Event] = []
    levels = Levels(clock=clock, listeners=[events.append])
    gate = levels.gate(3)
    pipeline = fw.Pipeline(fw.Fallback(value="static gifts"), gate)
    assert shell.run(pipeline, lambda: "live gifts") == "live gifts"
    levels.shed(3, ttl=10)
    assert shell.run(pipeline, lambda: "live gifts") == "static gifts"
    with pytest.raises(fw.DegradedError, match="dependency level 3 is shed"):
        shell.run(gate, lambda: "live gifts")
    assert gate.shed_calls == 2
    clock.advance(10)
    assert shell.run(pipeline, lambda: "live gifts") == "live gifts"
    assert [e.kind for e in events] == ["override", "override_ended"]
    levels.shed(2)
    assert levels.overrides()[0].target == "level:2"
    levels.restore(2)
    assert levels.overrides() == []
    with pytest.raises(fw.ConfigError, match="level 1 is never shed"):
        levels.shed(1)
    assert LevelGate(levels, 1).call(lambda: 1) == 1


# -- signals ----------------------------------------------------------------------------------


def test_signals_are_normalised_to_capacity() -> None:
    from floodwall.adaptive import AdaptiveLimiter, FixedLimit, LoadShedder, QueueingTimeAdmission

    clock = fw.FakeClock()
    dagor = QueueingTimeAdmission(clock=clock)
    dagor.on_start(0.0, 0.040)
    dagor.on_start(1.5, 0.040)  # closes the first window: 40 ms average, threshold 20 ms
    assert queueing_signal(dagor)() == pytest.approx(2.0)
    limiter = AdaptiveLimiter(FixedLimit(4), clock=clock)
    tokens = [limiter.acquire() for _ in range(3)]
    assert limiter_signal(limiter)() == pytest.approx(0.75)
    assert cpu_signal(lambda: 0.6)() == pytest.approx(0.75)
    shedder = LoadShedder(AdaptiveLimiter(FixedLimit(1), clock=clock), clock=clock)
    rate = shed_rate_signal(shedder, at=0.5)
    assert math.isnan(rate())
    ticket = shedder.admit()
    with pytest.raises(fw.OverloadedError):
        shedder.admit()
    assert rate() == pytest.approx(1.0)  # half refused, over 0.5
    ticket.success()
    for token in tokens:
        assert token is not None
        token.success()
    assert max_signal(lambda: 0.2, lambda: math.nan, lambda: 0.9)() == 0.9
    assert math.isnan(max_signal(lambda: math.nan)())
