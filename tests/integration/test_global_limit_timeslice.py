"""Time-slice limiting on a real Redis, in real time: three instances with background reporters
(0.2 s slices) are offered about three times a limit of 1000/s; after two slices the fleet's
admitted rate is the limit (within a wide margin: the offered rate jitters with the scheduler).
"""

from __future__ import annotations

import random
import time
import uuid

import pytest

from floodwall.shared.timeslice import TimeSliceLimiter
from floodwall.stores import connect

pytestmark = pytest.mark.integration

LIMIT = 1000
SLICE = 0.2


def test_the_fleet_converges_to_the_limit(redis_url: str) -> None:
    store = connect(redis_url, prefix=f"ts-{uuid.uuid4().hex[:8]}:")
    fleet = [
        TimeSliceLimiter(
            f"{LIMIT}/s", store=store, slice_length=SLICE, instance=f"i{n}", rng=random.Random(n)
        )
        for n in range(3)
    ]
    offered: list[tuple[float, int]] = []  # (time, admitted 0/1)
    try:
        start = time.monotonic()
        while (now := time.monotonic()) - start < 2.0:
            offered.extend((now, int(limiter.try_acquire())) for limiter in fleet)
            time.sleep(0.001)
    finally:
        for limiter in fleet:
            limiter.close()
        store.close()
    settled = [ok for t, ok in offered if t - start > 3 * SLICE]
    span = offered[-1][0] - (start + 3 * SLICE)
    offered_rate = len(settled) / span
    admitted_rate = sum(settled) / span
    expected_rate = _promised(offered, start) / span
    elected = [lim.elected for lim in fleet]
    print(
        f"\noffered {offered_rate:.0f}/s to a limit of {LIMIT}/s: admitted {admitted_rate:.0f}/s "
        f"after the first slices, {expected_rate:.0f}/s promised for the offered traffic; drop "
        f"rates {[round(lim.drop_rate, 3) for lim in fleet]}, elected {elected}, "
        f"syncs {[lim.syncs for lim in fleet]}"
    )
    assert offered_rate > 1.5 * LIMIT, "the test offers well above the limit"
    # The promise is the limit for steady traffic; this loop's traffic jitters with the
    # scheduler (on a busy machine a slice may get twice the one before it), and the drop rate
    # in force is the one computed from the slices before. So the admitted rate is judged
    # against what the promise gives for the traffic as offered, and that against the limit.
    assert 0.75 * expected_rate <= admitted_rate <= 1.25 * expected_rate
    assert 0.75 * LIMIT <= expected_rate <= 1.25 * LIMIT * _jitter(offered, start)
    assert elected.count(True) == 1
    assert all(lim.syncs >= 6 and lim.sync_errors == 0 for lim in fleet)


def _slices(offered: list[tuple[float, int]], start: float) -> list[int]:
    """Requests offered in each slice of the run (the test's slices: the fleet's own start
    within a few milliseconds of these)."""
    counts = [0] * (int((offered[-1][0] - start) / SLICE) + 1)
    for t, _ in offered:
        counts[int((t - start) / SLICE)] += 1
    return counts


def _promised(offered: list[tuple[float, int]], start: float) -> float:
    """Admissions the module's promise gives after the first three slices: each slice's
    requests times ``1 - drop_rate``, the drop rate from the two slices before it (the
    reports the elected instance sums)."""
    counts = _slices(offered, start)
    total = 0.0
    for k in range(3, len(counts)):
        qps = (counts[k - 1] + counts[k - 2]) / (2 * SLICE)
        total += counts[k] * min(1.0, LIMIT / qps) if qps else counts[k]
    return total


def _jitter(offered: list[tuple[float, int]], start: float) -> float:
    """How much more one slice offered than the two before it, at most (1 for steady
    traffic): the most the promise lets a slice's admissions exceed the limit by."""
    counts = _slices(offered, start)[:-1]  # the last slice is partial
    return max(
        (counts[k] / ((counts[k - 1] + counts[k - 2]) / 2) for k in range(3, len(counts))),
        default=1.0,
    )
