"""Retry budgets: the arithmetic, the rolling window, sharing, threads, and the invariant."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall import ConfigError, FakeClock, RetryBudget


def grants(budget: RetryBudget, now: float, limit: int = 10_000) -> int:
    """How many retries in a row the budget grants at ``now``."""
    granted = 0
    while granted < limit and budget.try_withdraw(now):
        granted += 1
    return granted


def test_ratio_of_requests_plus_floor(clock: FakeClock) -> None:
    budget = RetryBudget(0.1, min_per_second=0.5, window=10.0, clock=clock)
    now = clock.monotonic()
    for _ in range(100):
        budget.deposit(now)
    # retries + 1 <= 0.1 × 100 + 0.5 × 10  ->  15 retries
    assert grants(budget, now) == 15
    snap = budget.snapshot()
    assert (snap.requests, snap.retries) == (100, 15)
    assert snap.allowance == pytest.approx(15.0)
    assert snap.available == 0
    assert snap.retry_ratio == pytest.approx(0.15)


def test_floor_alone_lets_a_quiet_caller_retry(clock: FakeClock) -> None:
    budget = RetryBudget(min_per_second=1.0, clock=clock)  # defaults: ratio 0.1, 10 s window
    assert grants(budget, clock.monotonic()) == 10
    assert RetryBudget(0.1, min_per_second=0, clock=clock).try_withdraw(0.0) is False


def test_float_rounding_does_not_cost_a_retry() -> None:
    budget = RetryBudget(0.29, min_per_second=0)
    for _ in range(100):
        budget.deposit(5.0)
    assert grants(budget, 5.0) == 29  # 0.29 × 100 is 28.999999999999996 in floats


def test_window_rolls_off_old_requests_and_retries(clock: FakeClock) -> None:
    budget = RetryBudget(0.5, min_per_second=0, window=10.0, buckets=10, clock=clock)
    t0 = clock.monotonic()
    for _ in range(10):
        budget.deposit(t0)
    assert grants(budget, t0) == 5
    assert grants(budget, t0 + 9.5) == 0  # still inside the window
    # the bucket of t0 has fallen out: neither its requests nor its retries count any more
    assert budget.snapshot(t0 + 10.5).requests == 0
    assert budget.snapshot(t0 + 10.5).retries == 0
    budget.deposit(t0 + 10.5)
    budget.deposit(t0 + 10.5)
    assert grants(budget, t0 + 10.5) == 1


def test_reset_forgets_everything(clock: FakeClock) -> None:
    budget = RetryBudget(clock=clock)
    budget.deposit(clock.monotonic())
    budget.try_withdraw(clock.monotonic())
    budget.reset()
    assert budget.snapshot().requests == budget.snapshot().retries == 0


def test_exhausted_explains_the_figures(clock: FakeClock) -> None:
    budget = RetryBudget(0.1, min_per_second=0, name="db", clock=clock)
    for _ in range(20):
        budget.deposit(clock.monotonic())
    grants(budget, clock.monotonic())
    error = budget.exhausted("orders", clock.monotonic())
    assert isinstance(error, fw.RejectedError)
    assert error.kind == "retry_budget_exhausted"
    assert error.name == "db"
    assert "2 retries for 20 requests" in str(error)
    assert "0.1 × 20 + 0/s × 10s = 2" in str(error)


def test_deposits_from_many_threads_are_all_counted() -> None:
    clock = FakeClock(5.0)
    budget = RetryBudget(clock=clock)

    def worker() -> None:
        for _ in range(5000):
            budget.deposit(5.0)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.snapshot().requests == 40_000


def test_withdrawals_from_many_threads_never_overshoot() -> None:
    budget = RetryBudget(0.1, min_per_second=0)
    for _ in range(1000):
        budget.deposit(1.0)
    granted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = grants(budget, 1.0, limit=1000)
        with lock:
            granted.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 100


def test_shared_budget_counts_nested_requests_once(clock: FakeClock) -> None:
    assert not RetryBudget().shared
    budget = RetryBudget(clock=clock)
    budget.attach()
    assert budget.enter(1.0) is None  # a private budget just deposits
    budget.attach()
    assert budget.shared
    outer = budget.enter(1.0)
    assert outer is not None
    assert budget.enter(1.0) is None  # nested in the same logical request: not counted again
    budget.leave(outer)
    assert budget.enter(1.0) is not None  # a new logical request
    assert budget.snapshot(1.0).requests == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ratio": 1.5}, r"ratio must be a number of retries per request in \[0, 1\], "),
        ({"ratio": -0.1}, "ratio must be a number of retries per request in"),
        ({"min_per_second": -1}, r"min_per_second must be a finite number of retries per sec"),
        ({"window": 0}, r"window must be a finite number of seconds > 0, got 0"),
        ({"window": math.inf}, "window must be a finite number"),
        ({"buckets": 0}, "buckets must be an integer >= 1, got 0"),
    ],
)
def test_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetryBudget(**kwargs)  # type: ignore[arg-type]


# -- the invariant, against a reference model -------------------------------------------------

Step = tuple[str, int]


class Reference:
    """The budget's rule spelled out over an explicit event list, with the same 1 s buckets."""

    def __init__(self, ratio: float, floor: float, buckets: int) -> None:
        self.ratio, self.floor, self.buckets = ratio, floor, buckets
        self.events: list[tuple[int, str]] = []  # (bucket epoch, "req" | "retry")

    def counts(self, epoch: int) -> tuple[int, int]:
        live = [kind for e, kind in self.events if epoch - self.buckets < e <= epoch]
        return live.count("req"), live.count("retry")

    def withdraw(self, epoch: int) -> bool:
        requests, retries = self.counts(epoch)
        if retries + 1 <= self.ratio * requests + self.floor + 1e-9:
            self.events.append((epoch, "retry"))
            return True
        return False


steps = st.lists(
    st.tuples(st.sampled_from(["advance", "deposit", "withdraw"]), st.integers(0, 12)),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    ratio=st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.5, 1.0]),
    min_per_second=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    script=steps,
)
def test_budget_matches_reference_and_never_overspends(
    ratio: float, min_per_second: float, script: list[Step]
) -> None:
    """Every grant agrees with the reference model, and at every grant the window holds at most
    ``ratio × requests + min_per_second × window`` retries."""
    budget = RetryBudget(ratio, min_per_second=min_per_second, window=10.0, buckets=10)
    model = Reference(ratio, min_per_second * 10.0, 10)
    quarter_seconds = 0
    for action, amount in script:
        now = quarter_seconds / 4  # exact in binary floating point
        epoch = quarter_seconds // 4
        if action == "advance":
            quarter_seconds += amount
        elif action == "deposit":
            for _ in range(amount):
                budget.deposit(now)
                model.events.append((epoch, "req"))
        else:
            for _ in range(amount):
                granted = budget.try_withdraw(now)
                assert granted == model.withdraw(epoch)
                requests, retries = model.counts(epoch)
                if granted:
                    assert retries <= ratio * requests + min_per_second * 10.0 + 1e-9
        snap = budget.snapshot(now)
        assert (snap.requests, snap.retries) == model.counts(epoch)
