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


# -- the wait rule (floodwall's, issue 18) ------------------------------------------------------

MS = 1e-3


def _busy_worker(adm: QueueingTimeAdmission) -> float:
    """Four arrivals at t = 0 on a one-worker server at 2 ms a request; three of them served
    back to back, each start and end reported: the service time (2 ms) and the interval between
    starts while requests wait (2 ms) are measured, one request still waits. Returns now."""
    for _ in range(4):
        assert adm.admit(0.0, 0, 0)
    now = 0.0
    for _ in range(3):
        adm.on_start(now, now)  # each arrived at 0, before the previous start
        now += 2 * MS
        adm.on_finish(now, 2 * MS)
    return now


def test_wait_rule_refuses_an_arrival_queued_behind_four_service_times() -> None:
    """An arrival is refused when the requests admitted ahead of it and not yet started would
    take longer than max_wait_ratio (4) mean service times to start: with 2 ms between starts
    and 2 ms of service, four waiting are admitted, a fifth behind them is not."""
    adm = QueueingTimeAdmission(business_levels=1, user_levels=4)
    now = _busy_worker(adm)
    for _ in range(3):  # 1, 2 and 3 waiting ahead: 2, 4, 6 ms of queue
        assert adm.admit(now, 0, 0)
    assert adm.admit(now, 0, 0)  # 4 ahead: 8 ms, exactly 4 service times: admitted
    assert adm.admit(now, 0, 0) is False  # 5 ahead: 10 ms > 8 ms
    assert (adm.wait_refused, adm.rejected, adm.admitted) == (1, 1, 8)
    adm.on_abandon(now)  # one waiter left: a place is free again
    assert adm.admit(now, 0, 0)
    adm.on_start(now, now)  # the worker takes the next one: another place
    assert adm.admit(now, 0, 0)
    assert adm.admit(now, 0, 0) is False


def test_wait_rule_is_off_until_starts_and_ends_are_reported() -> None:
    """Without ends (no service time) or starts (no interval) nothing is known about the queue:
    the paper's admission alone decides. max_wait_ratio=None turns the rule off."""
    no_ends = QueueingTimeAdmission(business_levels=1, user_levels=4)
    for _ in range(4):
        no_ends.admit(0.0, 0, 0)
    for step in range(3):
        no_ends.on_start(step * 2 * MS, step * 2 * MS)
    assert all(no_ends.admit(0.006, 0, 0) for _ in range(100))
    no_starts = QueueingTimeAdmission(business_levels=1, user_levels=4)
    no_starts.on_finish(0.002, 0.002)
    assert all(no_starts.admit(0.002, 0, 0) for _ in range(100))
    paper = QueueingTimeAdmission(business_levels=1, user_levels=4, max_wait_ratio=None)
    now = _busy_worker(paper)
    assert all(paper.admit(now, 0, 0) for _ in range(100))
    assert paper.wait_refused == 0


def test_wait_rule_forgets_unreported_requests_after_two_windows() -> None:
    """A request admitted and never reported (started or abandoned) stops counting as waiting
    once the window after the next one closes, so a caller that loses track of a request
    cannot wedge the guard."""
    adm = QueueingTimeAdmission(business_levels=1, user_levels=4)
    now = _busy_worker(adm)
    for _ in range(4):
        adm.admit(now, 0, 0)
    assert adm.admit(now, 0, 0) is False  # five waiting (one from the start, four new)
    assert adm.admit(1.0, 0, 0) is False  # the next window: still waiting
    assert adm.admit(2.0, 0, 0) is False  # and the one after
    assert adm.admit(3.0, 0, 0)  # three windows on: forgotten


def test_wait_rule_overflow_is_overload_and_a_surge() -> None:
    """A window in which the wait rule refused more than overflow_share (20 %) of the arrivals
    is overloaded, and a surge: the level, which sheds whole users, takes over from the rule.
    One worker at 1 ms a request, arrivals at ten times that (one every 0.1 ms, users 0..99 in
    turn): the rule refuses most of them; the window closes early at 0.1 s with 100 starts, the
    service rate is measured (1 000/s) and the level is cut to it less alpha: 95 of the window's
    1 000 arrivals, 10 per user, so users 0..8 (90) and not 9."""
    adm = QueueingTimeAdmission(business_levels=1, user_levels=100)
    started = 0
    for i in range(1000):
        now = i * 0.1 * MS
        while started * MS <= now:  # the worker starts one every 1 ms, each queued 1.5 ms
            if started:
                adm.on_finish(started * MS, 1 * MS)
            adm.on_start(started * MS, 1.5 * MS if started else 0.0)
            started += 1
        adm.admit(now, 0, i % 100)
    assert adm.wait_refused > 0.2 * 1000
    assert adm.last_queueing_time == 0.0  # no window closed yet
    adm.admit(0.1, 0, 0)  # closes the window: 0.1 s, 1 000 arrivals, a surge
    assert adm.overloaded
    assert adm.capacity == pytest.approx(1000, rel=0.02)
    assert adm.level.user == 8


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
        (
            {"max_wait_ratio": 0},
            r"max_wait_ratio must be a finite number > 0, got 0",
        ),
        ({"overflow_share": 1.0}, r"overflow_share must be a number in \[0, 1\), got 1\.0"),
    ],
)
def test_dagor_options_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QueueingTimeAdmission(**kwargs)  # type: ignore[arg-type]
