"""Backoff strategies: each formula, its bounds over many seeded draws, and validation.

Formulas: Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog (2015).
"""

from __future__ import annotations

import importlib.util
import itertools
import random
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall import ConfigError
from floodwall.backoff import (
    Backoff,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    Fixed,
    FullJitter,
    Linear,
    NoBackoff,
    Uniform,
)

DRAWS = 10_000


def take(strategy: Backoff, n: int, rng: random.Random | None = None) -> list[float]:
    return list(itertools.islice(strategy.delays(rng), n))


def test_deterministic_shapes() -> None:
    assert take(NoBackoff(), 3) == [0.0, 0.0, 0.0]
    assert take(Fixed(0.5), 3) == [0.5, 0.5, 0.5]
    assert take(Fixed(0.5, cap=0.2), 2) == [0.2, 0.2]
    assert take(Linear(0.1), 4) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert take(Linear(1.0, step=0.5, cap=2.2), 5) == [1.0, 1.5, 2.0, 2.2, 2.2]
    assert take(Exponential(0.1), 4) == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert take(Exponential(1.0, multiplier=3.0, cap=20.0), 5) == [1.0, 3.0, 9.0, 20.0, 20.0]


def test_exponential_never_overflows() -> None:
    delays = take(Exponential(1.0, cap=float("inf")), 2000)
    assert delays[:3] == [1.0, 2.0, 4.0]
    assert delays[-1] == float("inf")  # grows to inf without an OverflowError
    capped = take(Exponential(1.0, cap=60.0), 5000)
    assert capped[-1] == 60.0


def test_each_call_to_delays_starts_over() -> None:
    strategy = Exponential(0.1)
    first = strategy.delays()
    next(first)
    next(first)
    assert next(strategy.delays()) == 0.1


def test_uniform_bounds_and_spread() -> None:
    draws = take(Uniform(0.2, 0.6), DRAWS, random.Random(1))
    assert all(0.2 <= d < 0.6 for d in draws)
    assert statistics.fmean(draws) == pytest.approx(0.4, abs=0.01)
    assert max(take(Uniform(0.2, 0.6, cap=0.3), 100, random.Random(1))) <= 0.3


def test_full_jitter_bounds_per_retry() -> None:
    """uniform(0, min(cap, base × 2^(n−1))): every draw in range, mean half the ceiling."""
    rng = random.Random(7)
    strategy = FullJitter(base=0.1, cap=1.0)
    by_retry: list[list[float]] = [[] for _ in range(6)]
    for _ in range(2000):
        for n, delay in enumerate(take(strategy, 6, rng)):
            by_retry[n].append(delay)
    for n, draws in enumerate(by_retry):
        ceiling = min(1.0, 0.1 * 2**n)
        assert all(0.0 <= d <= ceiling for d in draws)
        assert statistics.fmean(draws) == pytest.approx(ceiling / 2, rel=0.05)
        assert max(draws) > 0.95 * ceiling  # the whole interval is used
        assert min(draws) < 0.05 * ceiling


def test_equal_jitter_bounds_per_retry() -> None:
    """v/2 + uniform(0, v/2): never below half the exponential value."""
    rng = random.Random(8)
    strategy = EqualJitter(base=0.1, cap=1.0)
    by_retry: list[list[float]] = [[] for _ in range(6)]
    for _ in range(2000):
        for n, delay in enumerate(take(strategy, 6, rng)):
            by_retry[n].append(delay)
    for n, draws in enumerate(by_retry):
        v = min(1.0, 0.1 * 2**n)
        assert all(v / 2 <= d <= v for d in draws)
        assert statistics.fmean(draws) == pytest.approx(0.75 * v, rel=0.03)


def test_decorrelated_jitter_bounds() -> None:
    """sₙ = min(cap, uniform(base, 3 × sₙ₋₁)), s₀ = base: each draw within its own bounds."""
    rng = random.Random(9)
    strategy = DecorrelatedJitter(base=0.1, cap=2.0)
    for _ in range(1000):
        previous = 0.1
        for delay in take(strategy, 10, rng):
            assert 0.1 <= delay <= min(2.0, 3 * previous)
            previous = delay
    first = take(strategy, 1, rng)[0]
    assert 0.1 <= first <= 0.3
    draws = [take(strategy, 1, rng)[0] for _ in range(DRAWS)]
    assert statistics.fmean(draws) == pytest.approx(0.2, rel=0.03)  # uniform(0.1, 0.3)


def test_rng_precedence_and_reproducibility() -> None:
    own = FullJitter(rng=random.Random(3))
    assert take(own, 5, random.Random(99)) == take(FullJitter(), 5, random.Random(3))
    assert take(FullJitter(), 5, random.Random(5)) == take(FullJitter(), 5, random.Random(5))
    assert take(FullJitter(), 5) != take(FullJitter(), 5)  # the shared default rng moves on


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Fixed(-1.0), "delay must be a finite number of seconds >= 0, got -1.0"),
        (lambda: Fixed(float("inf")), "delay must be a finite number of seconds >= 0"),
        (lambda: Fixed(1.0, cap=-1), r"cap must be a number of seconds >= 0 \(inf allowed\)"),
        (lambda: Linear(float("nan")), "base must be a finite number of seconds >= 0, got nan"),
        (lambda: Uniform(2.0, 1.0), r"high must be >= low \(2.0\), got 1.0"),
        (lambda: Exponential(0.0), "base must be a finite number of seconds > 0, got 0.0"),
        (lambda: FullJitter(multiplier=0.5), "multiplier must be a finite number >= 1, got 0.5"),
        (lambda: EqualJitter(base=True), "base must be a finite number of seconds > 0, got True"),
        (lambda: DecorrelatedJitter(base=0), "base must be a finite number of seconds > 0, got 0"),
    ],
)
def test_validation_names_parameter_constraint_and_value(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]


def test_strategies_are_frozen_values() -> None:
    assert FullJitter(0.1, cap=2.0) == FullJitter(0.1, cap=2.0, rng=random.Random())
    with pytest.raises(AttributeError):
        FullJitter().base = 1.0  # type: ignore[misc]
    assert isinstance(FullJitter(), Backoff)


seconds = st.floats(min_value=1e-4, max_value=100.0, allow_nan=False)
multipliers = st.floats(min_value=1.0, max_value=10.0, allow_nan=False)


@given(base=seconds, cap=seconds, multiplier=multipliers, seed=st.integers(0, 2**32))
def test_exponential_family_bounds(base: float, cap: float, multiplier: float, seed: int) -> None:
    rng = random.Random(seed)
    plain = take(Exponential(base, multiplier, cap), 30)
    full = take(FullJitter(base, multiplier, cap), 30, rng)
    equal = take(EqualJitter(base, multiplier, cap), 30, rng)
    for n in range(30):
        v = min(cap, base * multiplier**n)
        assert plain[n] == pytest.approx(v, rel=1e-9)
        assert 0.0 <= full[n] <= v * (1 + 1e-9)
        assert v / 2 * (1 - 1e-9) <= equal[n] <= v * (1 + 1e-9)
    assert plain == sorted(plain)  # never shrinks


@given(base=seconds, cap=seconds, seed=st.integers(0, 2**32))
def test_decorrelated_bounds(base: float, cap: float, seed: int) -> None:
    delays = take(DecorrelatedJitter(base, cap), 30, random.Random(seed))
    assert all(min(base, cap) <= d <= cap for d in delays)


@given(
    low=st.floats(0.0, 10.0),
    span=st.floats(0.0, 10.0),
    cap=seconds,
    seed=st.integers(0, 2**32),
)
def test_uniform_property(low: float, span: float, cap: float, seed: int) -> None:
    delays = take(Uniform(low, low + span, cap), 20, random.Random(seed))
    assert all(min(low, cap) <= d <= min(low + span, cap) for d in delays)


def test_jitter_simulation_full_jitter_halves_the_calls() -> None:
    """The AWS blog's finding, on its simulator's setup (``benchmarks/jitter_sim.py``): with 100
    clients contending on one row, full jitter needs under half the calls of plain exponential."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "jitter_sim.py"
    spec = importlib.util.spec_from_file_location("floodwall_bench_jitter_sim", path)
    assert spec is not None
    assert spec.loader is not None
    sim = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sim  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(sim)
    finally:
        del sys.modules[spec.name]
    full = sim.measure(sim.STRATEGIES["FullJitter"], 100, 10, seed=1)
    plain = sim.measure(sim.STRATEGIES["Exponential"], 100, 10, seed=1)
    assert full.calls < 0.5 * plain.calls
    assert full.seconds < plain.seconds
