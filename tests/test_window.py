"""Rolling windows: eviction, late records, count windows, the latency summary."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall import CountWindow, Kind, TimeWindow
from floodwall._core.window import HISTOGRAM_BINS, latency_bin, latency_bin_bounds


def test_time_window_counts_each_kind() -> None:
    w = TimeWindow(10, 1.0, slow_call_duration=0.5)
    w.record(0.1, Kind.SUCCESS, 0.1)
    w.record(0.2, Kind.FAILURE, 0.6)
    w.record(0.3, Kind.TIMEOUT, 1.0)
    w.record(0.4, Kind.REJECTED, 0.0)
    w.record(0.5, Kind.IGNORED, 9.0)
    assert w.add_success(0.6, 0.01)
    assert not w.add_success(0.7, 0.51)  # slower than 0.5 s: refused, the owner records it
    snap = w.snapshot(0.8)
    assert (snap.calls, snap.failures, snap.timeouts, snap.rejections) == (5, 1, 1, 1)
    assert (snap.errors, snap.successes, snap.slow_calls) == (3, 2, 2)
    assert snap.failure_rate == pytest.approx(0.6)
    assert snap.slow_call_rate == pytest.approx(0.4)
    assert snap.span == 10.0


def test_buckets_leave_the_window_whole() -> None:
    w = TimeWindow(3, 1.0)
    w.record(0.5, Kind.FAILURE, 0)
    w.record(1.5, Kind.FAILURE, 0)
    w.record(2.5, Kind.FAILURE, 0)
    assert w.snapshot(2.9).calls == 3
    assert w.snapshot(3.0).calls == 2  # bucket [0, 1) is out
    assert w.snapshot(4.99).calls == 1
    assert w.snapshot(100.0).calls == 0


def test_add_success_refuses_outside_the_current_bucket() -> None:
    w = TimeWindow(3, 1.0)
    assert not w.add_success(0.5, 0.0)  # empty window: the first record must rotate
    w.record(0.5, Kind.SUCCESS, 0.0)
    assert w.add_success(0.9, 0.0)
    assert not w.add_success(1.0, 0.0)
    assert w.totals() == (2, 0, 0, 0, 0)


def test_add_success_in_counts_the_bin_it_is_given_as_add_success_does() -> None:
    """The meter's bisection shared: the same counts as :meth:`add_success`, and the same
    refusals (slow, outside the current bucket, a count window)."""
    found, given = (
        TimeWindow(3, 1.0, slow_call_duration=0.5),
        TimeWindow(3, 1.0, slow_call_duration=0.5),
    )
    for w in (found, given):
        w.record(0.1, Kind.SUCCESS, 0.2)
    for duration in (0.0, 0.001, 0.0123, 0.3):
        assert found.add_success(0.5, duration)
        assert given.add_success_in(0.5, duration, latency_bin(duration))
    assert not given.add_success_in(0.6, 0.51, latency_bin(0.51))  # slow: the owner records it
    assert not given.add_success_in(1.0, 0.0, latency_bin(0.0))  # the next bucket
    assert found.snapshot(0.9) == given.snapshot(0.9)
    assert sum(given.snapshot(0.9).histogram) == 5
    assert not CountWindow(3).add_success_in(0, 0.0, 0)


def test_late_records_land_in_their_bucket_while_it_is_live() -> None:
    w = TimeWindow(3, 1.0)
    w.record(2.5, Kind.SUCCESS, 0)
    w.record(1.2, Kind.FAILURE, 0)  # a thread that read the clock before the rotation
    w.record(-5.0, Kind.FAILURE, 0)  # far too old: dropped
    assert w.totals() == (2, 1, 0, 0, 0)
    assert w.snapshot(3.5).calls == 2  # [1, 2) is still one of the three live buckets
    assert w.snapshot(4.0).calls == 1  # and leaves on time


def test_reset_forgets_everything() -> None:
    w = TimeWindow()
    for i in range(10):
        w.record(i * 0.5, Kind.FAILURE, 0.1)
    w.reset()
    assert w.snapshot(5.0).calls == 0
    assert sum(w.snapshot(5.0).histogram) == 0


def test_count_window_keeps_the_last_n() -> None:
    w = CountWindow(3, slow_call_duration=1.0)
    for kind, duration in [(Kind.FAILURE, 2.0), (Kind.SUCCESS, 0.0), (Kind.TIMEOUT, 0.0)]:
        w.record(0, kind, duration)
    assert w.totals() == (3, 1, 1, 0, 1)
    w.record(0, Kind.SUCCESS, 0.0)  # pushes out the slow failure
    assert w.totals() == (3, 0, 1, 0, 0)
    w.record(0, Kind.IGNORED, 0.0)
    assert w.totals() == (3, 0, 1, 0, 0)
    assert not w.add_success(0, 0.0)  # a ring has no lock-free path
    assert sum(w.snapshot(0).histogram) == 3


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_sizes_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=f"got {bad!r}"):
        TimeWindow(bad)
    with pytest.raises(ValueError, match=f"got {bad!r}"):
        CountWindow(bad)


def test_latency_bins_are_contiguous_and_cover_the_range() -> None:
    for index in range(HISTOGRAM_BINS - 1):
        assert latency_bin_bounds(index)[1] == pytest.approx(latency_bin_bounds(index + 1)[0])
    assert latency_bin_bounds(0)[0] < 1.1e-6
    assert latency_bin_bounds(HISTOGRAM_BINS - 1)[1] > 1000.0
    assert latency_bin(0.0) == 0
    assert latency_bin(-1.0) == 0
    assert latency_bin(1e9) == HISTOGRAM_BINS - 1


@given(st.floats(min_value=2e-6, max_value=1000.0))
def test_a_duration_falls_in_its_bin(seconds: float) -> None:
    low, high = latency_bin_bounds(latency_bin(seconds))
    assert low <= seconds < high
    assert high / low <= 1.26  # a quarter octave at most: ±12 % around the bin's middle


def test_percentiles_are_within_a_bin_of_the_truth() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(math.log(0.02), 0.8) for _ in range(20_000)]
    w = TimeWindow(10, 1.0)
    for sample in samples:
        w.record(0.5, Kind.SUCCESS, sample)
    snap = w.snapshot(0.5)
    samples.sort()
    for q in (0.5, 0.9, 0.99):
        truth = samples[int(q * len(samples)) - 1]
        assert snap.percentile(q) == pytest.approx(truth, rel=0.2)
    assert snap.p50 == snap.percentile(0.5)
    assert TimeWindow().snapshot(0).p99 is None
    with pytest.raises(ValueError, match="q must be in"):
        snap.percentile(1.5)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=3.0),  # time step
            st.sampled_from([Kind.SUCCESS, Kind.FAILURE, Kind.TIMEOUT, Kind.REJECTED]),
            st.booleans(),  # use the lock-free path for successes
        ),
        max_size=80,
    )
)
def test_time_window_matches_a_recount(steps: list[tuple[float, Kind, bool]]) -> None:
    """Whatever the sequence, the window's figures equal a recount of the live records."""
    w = TimeWindow(5, 0.5)
    now = 0.0
    kept: list[tuple[int, Kind]] = []
    for step, kind, fast in steps:
        now += step
        if not (fast and kind is Kind.SUCCESS and w.add_success(now, 0.001)):
            w.record(now, kind, 0.001)
        kept.append((math.floor(now / 0.5), kind))
        live = [k for epoch, k in kept if epoch > math.floor(now / 0.5) - 5]
        snap = w.snapshot(now)
        assert snap.calls == len(live)
        assert snap.failures == live.count(Kind.FAILURE)
        assert snap.timeouts == live.count(Kind.TIMEOUT)
        assert snap.rejections == live.count(Kind.REJECTED)
        assert sum(snap.histogram) == len(live)
