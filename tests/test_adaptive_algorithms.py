"""The limit algorithms' rules beyond the golden traces: bounds, guards, probes, validation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall import ConfigError
from floodwall.adaptive import (
    AIMDLimit,
    FixedLimit,
    Gradient2Limit,
    GradientLimit,
    Limit,
    MinimumMeasurement,
    VegasLimit,
    WindowedLimit,
    log10_root,
    square_root,
)

MS = 1e-3


def test_helper_functions_match_concurrency_limits() -> None:
    # Log10RootFunction / SquareRootFunction: max(1, int(f(x)))
    assert [log10_root(v) for v in (0, 1, 9, 10, 99, 100, 999, 1000, 10000)] == [
        1, 1, 1, 1, 1, 2, 2, 3, 4,
    ]  # fmt: skip
    assert [square_root(v) for v in (0, 1, 3, 4, 15, 16, 1000)] == [1, 1, 1, 2, 3, 4, 31]


def test_aimd_rules() -> None:
    limit = AIMDLimit(initial_limit=20, min_limit=10, max_limit=21)
    assert limit.on_sample(0, 1 * MS, 9, False) == 20  # app-limited: 9 * 2 < 20
    assert limit.on_sample(0, 1 * MS, 10, False) == 21
    assert limit.on_sample(0, 1 * MS, 20, False) == 21  # max_limit
    assert limit.on_sample(0, 6.0, 20, False) == 18  # slower than the 5 s timeout = a drop
    for _ in range(10):
        limit.on_sample(0, 0, 0, True)
    assert limit.limit == 10  # min_limit


def test_gradient2_ignores_drops_and_app_limited_samples() -> None:
    limit = Gradient2Limit(
        initial_limit=50, min_limit=1, max_concurrency=100, queue_size=4, decrease_smoothing=0.2
    )
    assert limit.on_sample(0, 10 * MS, 50, True) == 50  # drop ignored: RTT steady, +queue
    before = limit.estimated_limit
    assert limit.on_sample(0, 10 * MS, 10, False) == int(before)  # inflight < limit / 2
    for _ in range(8):  # the long RTT's 10-sample warm-up, at 10 ms
        limit.on_sample(0, 10 * MS, 100, False)
    # latency quadruples, past the 1.5 tolerance: the limit shrinks, at most by half per sample
    # (gradient >= 0.5), while the long average follows the new RTT only slowly
    for _ in range(30):
        limit.on_sample(0, 40 * MS, 100, False)
    assert limit.limit < 40
    assert limit.long_rtt > 10 * MS


def test_gradient2_decays_a_stale_long_rtt() -> None:
    limit = Gradient2Limit(long_window=600)
    for _ in range(10):
        limit.on_sample(0, 100 * MS, 20, False)
    assert limit.long_rtt == pytest.approx(100 * MS)
    limit.on_sample(0, 10 * MS, 20, False)  # long/short > 2: long RTT *= 0.95
    factor = 2 / 601
    assert limit.long_rtt == pytest.approx((100 * MS * (1 - factor) + 10 * MS * factor) * 0.95)


def test_gradient_first_sample_grows_by_the_queue() -> None:
    # queue = max(4, sqrt(50)) = 7; gradient = min(1, 2 * 10 ms / 10 ms) = 1 -> 50 + 7
    limit = GradientLimit(initial_limit=50, probe_interval=None, rng=random.Random(1))
    assert limit.on_sample(0, 10 * MS, 50, False) == 57


def test_gradient_growth_backoff_and_floor() -> None:
    limit = GradientLimit(initial_limit=16, probe_interval=None, rng=random.Random(1))
    assert limit.on_sample(0, 10 * MS, 16, False) == 20  # 16 * 1 + max(4, sqrt(16)) = 20
    assert limit.on_sample(0, 15 * MS, 20, False) == 24  # 1.5x latency is within tolerance 2
    # 4x latency: gradient 0.5 -> new = 12 + 4 = 16, smoothed: 24 * 0.8 + 16 * 0.2 = 22.4
    assert limit.on_sample(0, 40 * MS, 24, False) == 22
    assert limit.on_sample(0, 10 * MS, 22, True) == 21  # drop: 22.4*0.9 -> smoothed 22.0 ... 21
    assert limit.on_sample(0, 10 * MS, 1, False) == 21  # app-limited


def test_gradient_probe_resets_limit_and_min_rtt() -> None:
    limit = GradientLimit(initial_limit=100, probe_interval=5, rng=random.Random(3))
    seen = [limit.on_sample(0, 10 * MS, 1000, False) for _ in range(12)]
    probes = [i for i in range(1, len(seen)) if seen[i] < seen[i - 1]]
    assert probes, seen
    first = probes[0]
    # the probe drops the limit to the queue size, max(4, sqrt(limit)), and forgets the min RTT
    assert seen[first] == max(4, square_root(seen[first - 1]))
    assert limit.rtt_noload == pytest.approx(10 * MS)


def test_vegas_probes_a_new_noload_rtt() -> None:
    limit = VegasLimit(initial_limit=10, probe_multiplier=1, rng=random.Random(0))
    limit.on_sample(0, 10 * MS, 10, False)
    for _ in range(20):
        limit.on_sample(0, 30 * MS, 10, False)
    assert limit.rtt_noload == pytest.approx(30 * MS)  # re-probed at the higher RTT


def test_vegas_rejects_non_positive_rtt() -> None:
    with pytest.raises(ValueError, match="rtt must be > 0"):
        VegasLimit().on_sample(0, 0.0, 1, False)


def test_fixed_limit_never_moves_and_listeners_hear_changes() -> None:
    fixed = FixedLimit(7)
    assert fixed.on_sample(0, 1.0, 100, True) == 7
    heard: list[int] = []
    aimd = AIMDLimit(initial_limit=20)
    aimd.subscribe(heard.append)
    aimd.on_sample(0, 1 * MS, 10, False)
    aimd.on_sample(0, 1 * MS, 1, False)  # unchanged: not reported
    aimd.unsubscribe(heard.append)
    aimd.on_sample(0, 1 * MS, 11, False)
    assert heard == [21]
    assert repr(aimd) == "AIMDLimit(limit=22)"


def test_minimum_measurement() -> None:
    minimum = MinimumMeasurement()
    assert [minimum.add(v) for v in (5.0, 7.0, 3.0)] == [5.0, 5.0, 3.0]
    minimum.reset()
    assert minimum.add(9.0) == 9.0


class _Recorder(Limit):
    """A limit that records what reaches it."""

    def __init__(self) -> None:
        super().__init__(10)
        self.samples: list[tuple[float, float, int, bool]] = []

    def _update(self, start: float, rtt: float, inflight: int, dropped: bool) -> int:
        self.samples.append((start, rtt, inflight, dropped))
        return self._limit + 1


def test_windowed_aggregates_per_window() -> None:
    inner = _Recorder()
    windowed = WindowedLimit(inner)
    windowed.on_sample(0.0, 10 * MS, 1, False)  # first sample: closes an empty window
    for i in range(10):
        windowed.on_sample(0.1 * i, 20 * MS + i * MS, i, i == 3)
    assert inner.samples == []  # the 1 s window is still open
    windowed.on_sample(1.5, 30 * MS, 2, False)  # ends after the deadline: window closes
    assert len(inner.samples) == 1
    _, rtt, inflight, dropped = inner.samples[0]
    assert rtt == pytest.approx((sum(20 + i for i in range(10)) + 30) / 11 * MS)
    assert (inflight, dropped) == (9, True)
    assert windowed.limit == 11


def test_windowed_discards_fast_samples_and_thin_windows() -> None:
    inner = _Recorder()
    windowed = WindowedLimit(inner, window_size=10)
    for i in range(50):
        windowed.on_sample(i * 0.1, 50e-6, 1, False)  # < 100 µs: discarded
    windowed.on_sample(0.0, 10 * MS, 1, False)
    for i in range(5):
        windowed.on_sample(0.2 * i, 10 * MS, 1, False)
    windowed.on_sample(3.0, 10 * MS, 1, False)  # window of 6 samples < 10: not passed on
    assert inner.samples == []


def test_windowed_percentile() -> None:
    inner = _Recorder()
    windowed = WindowedLimit(inner, percentile=0.9, window_size=10)
    windowed.on_sample(0.0, 1 * MS, 1, False)
    for i in range(1, 11):
        windowed.on_sample(0.05 * i, i * MS, 1, False)
    windowed.on_sample(2.0, 11 * MS, 1, False)
    # 11 samples 1..11 ms: round(11 * 0.9) = 10th smallest = 10 ms
    assert inner.samples[0][1] == pytest.approx(10 * MS)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: AIMDLimit(backoff_ratio=1.0), "backoff_ratio must be a number in"),
        (lambda: AIMDLimit(min_limit=30, max_limit=20), "max_limit must be >= min_limit"),
        (lambda: AIMDLimit(timeout=0), "timeout must be"),
        (lambda: AIMDLimit(initial_limit=0), "initial_limit must be an integer >= 1"),
        (lambda: VegasLimit(initial_limit=30, max_concurrency=20), "initial_limit must be <="),
        (lambda: VegasLimit(smoothing=1.5), "smoothing must be a number in"),
        (lambda: GradientLimit(rtt_tolerance=0.5), "rtt_tolerance must be a finite number >= 1"),
        (lambda: Gradient2Limit(min_limit=30, max_concurrency=20), "max_concurrency must be"),
        (lambda: WindowedLimit(FixedLimit(1), percentile=0), "percentile must be a number in"),
        (lambda: WindowedLimit(FixedLimit(1), min_window_time=2.0), "max_window_time must be"),
        (lambda: WindowedLimit("x"), "delegate must be"),  # type: ignore[arg-type]
    ],
)
def test_options_are_validated_loudly(factory: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        factory()  # type: ignore[operator]


samples = st.lists(
    st.tuples(
        st.floats(min_value=1e-4, max_value=10.0),
        st.integers(min_value=0, max_value=500),
        st.booleans(),
    ),
    max_size=200,
)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_every_algorithm_stays_within_its_bounds(trace: list[tuple[float, int, bool]]) -> None:
    algorithms: list[tuple[Limit, int, int]] = [
        (AIMDLimit(), 20, 200),
        (VegasLimit(rng=random.Random(0)), 1, 1000),
        (GradientLimit(rng=random.Random(0)), 1, 1000),
        (Gradient2Limit(), 1, 200),
        (WindowedLimit(Gradient2Limit(min_limit=1)), 1, 200),
    ]
    for algorithm, low, high in algorithms:
        start = 0.0
        for rtt, inflight, dropped in trace:
            value = algorithm.on_sample(start, rtt, inflight, dropped)
            start += rtt
            assert low <= value <= high, (algorithm, value)
            assert value == algorithm.limit
