"""ClientThrottle: Google SRE book, "Handling Overload", client-side throttling (eq. 21-1)."""

from __future__ import annotations

import random

import pytest

from floodwall import ConfigError, FakeClock, OverloadedError, RateLimitedError
from floodwall.adaptive import ClientThrottle


def test_requests_count_local_rejections_and_accepts_lag(clock: FakeClock) -> None:
    throttle = ClientThrottle(clock=clock)
    for _ in range(100):
        assert throttle.attempt(clock.monotonic(), 0.999)  # sent (draw above any p)
    assert throttle.counts(clock.monotonic()) == (100, 0)
    assert throttle.probability() == pytest.approx(100 / 101)
    assert throttle.attempt(clock.monotonic(), 0.5) is False  # rejected locally...
    assert throttle.counts(clock.monotonic()) == (101, 0)  # ...but counted as a request
    for _ in range(60):
        throttle.accept()
    assert throttle.probability() == 0.0  # 101 - 2 * 60 < 0


def test_history_ages_out_after_two_minutes(clock: FakeClock) -> None:
    throttle = ClientThrottle(clock=clock)
    for _ in range(50):
        throttle.attempt(clock.monotonic(), 0.999)
    clock.advance(60)
    assert throttle.probability() == pytest.approx(50 / 51)
    clock.advance(61)
    assert throttle.probability() == 0.0


def test_k_and_max_reject(clock: FakeClock) -> None:
    lenient = ClientThrottle(k=4, clock=clock)
    strict = ClientThrottle(k=1.1, max_reject=0.9, clock=clock)
    for throttle in (lenient, strict):
        for _ in range(100):
            throttle.attempt(clock.monotonic(), 0.999)
        for _ in range(30):
            throttle.accept()
    assert lenient.probability() == 0.0  # 100 < 4 * 30
    assert strict.probability() == pytest.approx((100 - 33) / 101)
    for _ in range(1000):
        strict.attempt(clock.monotonic(), 0.999)
    assert strict.probability() == 0.9  # capped: probes still go out


def test_call_shell_counts_backend_rejections(clock: FakeClock) -> None:
    throttle = ClientThrottle("orders", rng=random.Random(1), clock=clock)

    def overloaded() -> None:
        raise RateLimitedError("backend", "429", 1.0)

    for _ in range(200):
        with pytest.raises((RateLimitedError, OverloadedError)):
            throttle.call(overloaded)
    requests, accepts = throttle.counts(clock.monotonic())
    assert (requests, accepts) == (200, 0)

    def fifty() -> None:
        for _ in range(50):
            throttle.call(lambda: None)

    with pytest.raises(OverloadedError) as info:
        fifty()
    assert info.value.name == "orders"
    assert "client-side throttling" in info.value.reason
    assert throttle.describe() == "ClientThrottle(k=2, window=120s)"


def test_call_shell_accepts_answers_and_business_errors(clock: FakeClock) -> None:
    throttle = ClientThrottle(rejected_result=lambda status: status == 503, clock=clock)
    assert throttle.call(lambda: 200) == 200
    assert throttle.call(lambda: 503) == 503

    def business() -> None:
        raise KeyError("not found")

    with pytest.raises(KeyError):
        throttle.call(business)
    assert throttle.counts(clock.monotonic()) == (3, 2)


async def test_call_async_shell(clock: FakeClock) -> None:
    throttle = ClientThrottle(clock=clock)

    async def ok() -> str:
        return "ok"

    async def fails() -> None:
        raise ValueError

    assert await throttle.call_async(ok) == "ok"
    with pytest.raises(ValueError):  # noqa: PT011 - any business error
        await throttle.call_async(fails)

    async def timeout() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await throttle.call_async(timeout)
    assert throttle.counts(clock.monotonic()) == (3, 2)
    for _ in range(300):
        throttle.attempt(clock.monotonic(), 0.999)
    throttle.rng = random.Random(0)

    async def fifty() -> None:
        for _ in range(50):
            await throttle.call_async(ok)

    with pytest.raises(OverloadedError):
        await fifty()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a finite number > 0"),
        ({"max_reject": 0}, "max_reject must be a number in"),
    ],
)
def test_throttle_options_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClientThrottle(**kwargs)  # type: ignore[arg-type]
