"""Frequency control as a policy, on the memory store with a fake clock (contract tests for
every store are in test_store_contract.py and test_frequency_stores below)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import Shell, StoreCase
from floodwall import ConfigError, Event, FakeClock, Pipeline, RateLimitedError
from floodwall.shared.frequency import Frequency
from floodwall.stores import MemoryStore


def _limiter(clock: FakeClock, limit: int, per: float, **options: object) -> Frequency:
    return Frequency(limit, per, store=MemoryStore(clock=clock), clock=clock, **options)  # type: ignore[arg-type]


def test_once_per_period(clock: FakeClock) -> None:
    once = Frequency.once(60, store=MemoryStore(clock=clock), clock=clock)
    first = once.allow("alice")
    assert first.allowed and first.remaining == 0 and first.retry_after is None
    clock.advance(20)
    second = once.allow("alice")
    assert not second.allowed and second.retry_after == pytest.approx(40)
    assert once.allow("bob").allowed
    clock.advance(40)
    assert once.allow("alice").allowed


def test_at_most_m_per_n_is_a_fixed_window_from_the_first_call(clock: FakeClock) -> None:
    posts = _limiter(clock, 5, 3600)
    assert [posts.allow("u").allowed for _ in range(7)] == [True] * 5 + [False] * 2
    clock.advance(1800)
    refused = posts.allow("u")
    assert not refused.allowed and refused.retry_after == pytest.approx(1800)
    assert refused.count == 5 and refused.remaining == 0
    clock.advance(1800)
    assert posts.allow("u").count == 1


def test_cost(clock: FakeClock) -> None:
    quota = _limiter(clock, 10, 60)
    assert quota.allow("k", cost=7).allowed
    assert not quota.allow("k", cost=4).allowed
    assert quota.allow("k", cost=3).remaining == 0
    with pytest.raises(ConfigError, match="cost"):
        quota.allow("k", cost=11)


def test_policy_shells_raise_a_typed_rejection(clock: FakeClock, shell: Shell) -> None:
    events: list[Event] = []
    limiter = _limiter(clock, 2, 10, key="global", name="sms", listeners=[events.append])
    assert shell.run(limiter, lambda: "sent") == "sent"
    assert shell.run(limiter, lambda: "sent") == "sent"
    with pytest.raises(RateLimitedError) as caught:
        shell.run(limiter, lambda: "sent")
    assert caught.value.kind == "rate_limited" and caught.value.name == "sms"
    assert caught.value.retry_after == pytest.approx(10)
    assert "2 calls per 10s" in str(caught.value)
    assert [e.kind for e in events] == ["rejected"]


def test_key_from_the_call_arguments(clock: FakeClock) -> None:
    limiter = _limiter(clock, 1, 60, key=lambda user, **_: f"user:{user}")
    sent: list[str] = []

    @limiter
    def notify(user: str, text: str) -> None:
        sent.append(f"{user}:{text}")

    notify("a", text="hi")
    notify("b", text="hi")
    with pytest.raises(RateLimitedError):
        notify("a", text="again")
    assert sent == ["a:hi", "b:hi"]
    assert "Frequency('frequency', once per 60s" in str(Pipeline(limiter))


def test_local_limit_is_the_limit_divided_by_instances(clock: FakeClock) -> None:
    assert _limiter(clock, 100, 1, expected_instances=8).local_limit == 12
    assert _limiter(clock, 3, 1, expected_instances=8).local_limit == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limit": 0, "per": 1}, "limit must be an integer >= 1"),
        ({"limit": 1, "per": 0}, "per must be"),
        ({"limit": 1, "per": 1, "expected_instances": 0}, "expected_instances"),
        ({"limit": 1, "per": 1, "key": ""}, "key must be"),
        ({"limit": 1, "per": 1, "on_store_error": "maybe"}, "on_store_error"),
        ({"limit": 1, "per": 1, "store": "ftp://x"}, "scheme"),
    ],
)
def test_options_are_validated(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Frequency(**options)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 5),
    steps=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 30)), max_size=40),
)
def test_matches_a_reference_model(limit: int, steps: list[tuple[str, int]]) -> None:
    """Against a tiny model: per key, a window opens at the first counted call and lasts
    ``per`` seconds; at most ``limit`` calls are counted in it."""
    clock = FakeClock(0.0)
    limiter = _limiter(clock, limit, 10)
    windows: dict[str, tuple[float, int]] = {}
    for key, wait in steps:
        clock.advance(wait / 2)
        now = clock.monotonic()
        start, count = windows.get(key, (-1e9, 0))
        if now >= start + 10:
            start, count = now, 0
        expected = count < limit
        if expected:
            windows[key] = (start, count + 1)
        decision = limiter.allow(key)
        assert decision.allowed is expected
        if not expected:
            assert decision.retry_after == pytest.approx(start + 10 - now, abs=1e-3)


# -- every store, through the policy --------------------------------------------------------


def test_frequency_on_every_store(store_case: StoreCase) -> None:
    once = Frequency.once(0.3, store=store_case.store, name="f1")
    many = Frequency(3, 0.3, store=store_case.store, name="f3")
    assert once.allow("k").allowed and not once.allow("k").allowed
    assert [many.allow("k").allowed for _ in range(4)] == [True, True, True, False]
    store_case.wait(0.4)
    assert once.allow("k").allowed and many.allow("k").allowed
    assert once.guard.failures == 0


async def test_frequency_async_on_every_store(async_store_case: StoreCase) -> None:
    many = Frequency(2, 60, store=async_store_case.store, name="fa")
    results = [(await many.allow_async("k")).allowed for _ in range(3)]
    assert results == [True, True, False]
