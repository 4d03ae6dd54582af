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
    elected = [lim.elected for lim in fleet]
    print(
        f"\noffered {offered_rate:.0f}/s to a limit of {LIMIT}/s: admitted {admitted_rate:.0f}/s "
        f"after the first slices; drop rates {[round(lim.drop_rate, 3) for lim in fleet]}, "
        f"elected {elected}, syncs {[lim.syncs for lim in fleet]}"
    )
    assert offered_rate > 1.5 * LIMIT, "the test offers well above the limit"
    assert 0.75 * LIMIT <= admitted_rate <= 1.25 * LIMIT
    assert elected.count(True) == 1
    assert all(lim.syncs >= 6 and lim.sync_errors == 0 for lim in fleet)
