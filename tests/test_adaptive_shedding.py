"""LoadShedder: queueing time, in-flight and the chosen limiter, before the work starts."""

from __future__ import annotations

import pytest

from floodwall import ConfigError, Event, FakeClock, OverloadedError, TimeoutExceeded
from floodwall.adaptive import (
    AdaptiveLimiter,
    BBRLimiter,
    FixedLimit,
    LoadShedder,
    QueueingTimeAdmission,
)


def test_sheds_stale_requests_by_queueing_time(clock: FakeClock) -> None:
    events: list[Event] = []
    shedder = LoadShedder(max_queue_time=0.1, clock=clock, listeners=[events.append])
    arrived = clock.monotonic()
    clock.advance(0.05)
    with shedder.admit(arrived_at=arrived) as ticket:
        assert ticket.queue_time == pytest.approx(0.05)
        assert shedder.inflight == 1
    assert shedder.inflight == 0
    clock.advance(0.2)
    with pytest.raises(OverloadedError) as info:
        shedder.admit(arrived_at=arrived)
    error = info.value
    assert (error.kind, error.name, error.retry_after) == ("overloaded", "load_shedder", 1.0)
    assert "queued 250 ms > 100 ms" in error.reason
    with pytest.raises(OverloadedError):
        shedder.admit(queue_time=0.5)
    stats = shedder.stats()
    assert (stats.admitted, stats.shed, stats.shed_stale) == (1, 2, 2)
    assert stats.average_queue_time == pytest.approx(0.05)
    assert events[0].kind == "shed" and events[0].figures["stale"] is True


def test_consults_an_adaptive_limiter_with_partitions(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(2), partitions={"live": 0.5}, clock=clock)
    shedder = LoadShedder(limiter, clock=clock)
    first = shedder.admit(partition="live")
    second = shedder.admit(partition="live")  # borrows the unreserved slot
    with pytest.raises(OverloadedError, match="concurrency limit 2 reached"):
        shedder.admit()
    assert limiter.inflight == 2
    assert first.success() and not first.success()
    second.dropped()
    assert limiter.inflight == 0 and shedder.inflight == 0


def test_consults_bbr(clock: FakeClock) -> None:
    shedder = LoadShedder(BBRLimiter(cpu=lambda: 1.0, clock=clock), clock=clock)
    held = [shedder.admit(), shedder.admit()]
    with pytest.raises(OverloadedError, match="BBR"):
        shedder.admit()
    for ticket in held:
        ticket.ignore()


def test_consults_dagor_with_the_queueing_time(clock: FakeClock) -> None:
    admission = QueueingTimeAdmission(business_levels=1, user_levels=4, clock=clock)
    shedder = LoadShedder(admission, clock=clock)
    for user in range(4):
        shedder.admit(queue_time=0.2, user=user).success()
    clock.advance(1.0)
    shedder.admit(queue_time=0.0, user=0).success()  # closes an overloaded window
    assert admission.overloaded
    with pytest.raises(OverloadedError, match="DAGOR"):
        shedder.admit(user=3)


def test_policy_shells_and_ticket_outcomes(clock: FakeClock) -> None:
    limiter = AdaptiveLimiter(FixedLimit(1), clock=clock)
    shedder = LoadShedder(limiter, clock=clock)
    assert shedder.call(lambda: 5) == 5
    assert shedder.guard(lambda: 6, arrived_at=clock.monotonic()) == 6

    def timed_out() -> None:
        raise TimeoutExceeded("t", 1.0)

    with pytest.raises(TimeoutExceeded):
        shedder.call(timed_out)
    with pytest.raises(ZeroDivisionError):
        shedder.call(lambda: 1 / 0)
    assert limiter.inflight == 0
    assert "LoadShedder(AdaptiveLimiter(" in shedder.describe()


async def test_async_shell(clock: FakeClock) -> None:
    shedder = LoadShedder(AdaptiveLimiter(FixedLimit(1), clock=clock), clock=clock)

    async def work() -> str:
        return "done"

    assert await shedder.call_async(work) == "done"
    held = shedder.admit()
    with pytest.raises(OverloadedError):
        await shedder.call_async(work)
    held.success()


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "needs a limiter, a max_queue_time or both"),
        (("x",), {}, "limiter must be"),
        ((), {"max_queue_time": 0}, "max_queue_time must be a finite number of seconds > 0"),
        ((), {"max_queue_time": 1, "retry_after": -1}, "retry_after must be a finite number of"),
    ],
)
def test_shedder_options_are_validated(
    args: tuple[object, ...], kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        LoadShedder(*args, **kwargs)  # type: ignore[arg-type]
