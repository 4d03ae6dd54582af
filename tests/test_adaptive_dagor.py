"""DAGOR queueing-time admission (Zhou et al., "Overload Control for Scaling WeChat
Microservices", SoCC 2018): windows, the 5 % / 1 % level moves, priorities, upstream levels."""

from __future__ import annotations

import pytest

from floodwall import ConfigError, Event, FakeClock
from floodwall.adaptive import (
    AdmissionLevel,
    QueueingTimeAdmission,
    UpstreamLevels,
    UserPriority,
    user_priority,
)


def _window(adm: QueueingTimeAdmission, now: float, queue: float, users: range) -> None:
    """One window's traffic: one request per user priority, each queued ``queue`` seconds."""
    for user in users:
        if adm.admit(now, 0, user):
            adm.on_start(now, queue)


def test_overloaded_window_cuts_the_admitted_share_by_alpha() -> None:
    adm = QueueingTimeAdmission(business_levels=1, user_levels=128, early_requests=1000)
    assert adm.level == AdmissionLevel(0, 127)
    _window(adm, 0.0, 0.050, range(100))  # 50 ms average > 20 ms
    adm.admit(1.0, 0, 0)  # the next arrival closes the 1 s window
    assert adm.overloaded
    assert adm.last_queueing_time == pytest.approx(0.050)
    # too few starts (100 < early_requests) to measure the service rate: the paper's step,
    # 100 admitted requests (one per user 0..99; the closing one opens the next window):
    # keep <= 95 %
    assert adm.capacity == 0.0
    assert adm.level == AdmissionLevel(0, 94)
    assert adm.admit(1.0, 0, 95) is False
    assert adm.admit(1.0, 0, 94) is True


def test_overloaded_window_cuts_to_the_service_rate_less_the_backlog() -> None:
    # A surge (145 ms average > 5 x 20 ms) over 100 starts in 1 s, the measured service rate:
    # Little's law puts (145 - 20) ms x 100/s = 12.5 requests beyond the threshold; the next
    # window admits 100 x 0.95 - 12.5 = 82.5 of this window's 100 arrivals: users 0..81.
    adm = QueueingTimeAdmission(business_levels=1, user_levels=128, early_requests=50)
    _window(adm, 0.0, 0.145, range(100))
    adm.admit(1.0, 0, 0)
    assert adm.overloaded
    assert adm.capacity == pytest.approx(100.0)
    assert adm.level == AdmissionLevel(0, 81)
    assert adm.admit(1.0, 0, 82) is False
    assert adm.admit(1.0, 0, 81) is True
    # 50 ms (overloaded, no surge): the paper's 5 % step, and no service rate measured
    calm = QueueingTimeAdmission(business_levels=1, user_levels=128, early_requests=50)
    _window(calm, 0.0, 0.050, range(100))
    calm.admit(1.0, 0, 0)
    assert (calm.level, calm.capacity) == (AdmissionLevel(0, 94), 0.0)


def test_calm_window_raises_the_share_by_beta() -> None:
    adm = QueueingTimeAdmission(business_levels=1, user_levels=128)
    adm._level = 49  # admitting users 0..49
    _window(adm, 0.0, 0.001, range(128))
    adm.admit(1.0, 0, 0)
    assert not adm.overloaded
    assert adm.level == AdmissionLevel(0, 50)  # 50 admitted -> >= 51: one more user level


def test_window_also_closes_after_window_requests() -> None:
    adm = QueueingTimeAdmission(window_requests=10, business_levels=1, user_levels=16)
    for _ in range(10):
        assert adm.admit(0.0, 0, 15)
        adm.on_start(0.0, 0.1)
    assert adm.overloaded  # closed by count, at t = 0
    assert adm.level.user < 15


def test_calm_window_without_arrivals_above_the_level_grows_one_step() -> None:
    adm = QueueingTimeAdmission(business_levels=2, user_levels=4)
    adm._level = 3  # (0, 3): upstream callers shed everything above
    _window(adm, 0.0, 0.0, range(4))
    adm.admit(1.0, 0, 0)
    assert adm.level == AdmissionLevel(1, 0)


def test_business_priority_dominates_user_priority() -> None:
    adm = QueueingTimeAdmission(business_levels=4, user_levels=8)
    adm._level = adm.compound(1, 3)
    assert adm.admit(0.0, 0, 7)  # more important business, any user
    assert adm.admit(0.0, 1, 3)
    assert not adm.admit(0.0, 1, 4)
    assert not adm.admit(0.0, 2, 0)
    assert adm.compound(99, -5) == adm.compound(3, 0)  # clamped


def test_level_never_goes_below_zero_and_emits_events() -> None:
    events: list[Event] = []
    adm = QueueingTimeAdmission(business_levels=1, user_levels=4, listeners=[events.append])
    for second in range(10):
        _window(adm, float(second), 1.0, range(4))
    assert adm.level == AdmissionLevel(0, 0)
    assert events and events[0].kind == "level_changed"
    assert "QueueingTimeAdmission(level=(0, 0)" in repr(adm)


def test_acquire_shell_records_queueing_time_on_the_clock(clock: FakeClock) -> None:
    adm = QueueingTimeAdmission(business_levels=1, user_levels=2, clock=clock)
    permit = adm.acquire(0.5, 0, 1)
    assert permit is not None and permit.success() and permit.dropped() and permit.ignore()
    clock.advance(1.0)
    adm.acquire(None, 0, 0)  # closes the window: average 0.5 s -> overloaded
    assert adm.overloaded
    assert adm.acquire(0.0, 0, 1) is None
    assert adm.rejected == 1


def test_user_priority_is_stable_and_rotates() -> None:
    assert user_priority("alice", 10) == user_priority(b"alice", 10)
    assert 0 <= user_priority(12345, 3) < 128
    spread = {user_priority(user, 7) for user in range(2000)}
    assert len(spread) == 128  # the hash covers every level
    rotated = sum(user_priority(u, 7) != user_priority(u, 8) for u in range(200))
    assert rotated > 150  # a new hour reshuffles almost everybody
    wall = [3600.0 * 5 + 10]
    priority = UserPriority(wall=lambda: wall[0])
    assert priority("bob") == user_priority("bob", 5)
    wall[0] += 3600
    assert priority("bob") == user_priority("bob", 6)


def test_upstream_levels_shed_early() -> None:
    levels = UpstreamLevels()
    assert levels.admits("m", 5, 100)  # unknown service: admit
    levels.update("m", (1, 10))
    assert levels.get("m") == AdmissionLevel(1, 10)
    assert levels.admits("m", 0, 127)
    assert levels.admits("m", 1, 10)
    assert not levels.admits("m", 1, 11)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0}, "alpha must be a number in"),
        ({"beta": 1}, "beta must be a number in"),
        ({"threshold": 0}, "threshold must be"),
        ({"window_requests": 0}, "window_requests must be"),
    ],
)
def test_dagor_options_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QueueingTimeAdmission(**kwargs)  # type: ignore[arg-type]
