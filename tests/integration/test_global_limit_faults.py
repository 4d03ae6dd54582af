"""Stop a real Redis under load, start it again: every global limiter keeps answering.

Five limiters share one Redis: three :class:`GlobalLimiter` (GCRA, one per ``on_store_error``
mode), a :class:`LeasedLimiter` (``local``) and a :class:`TimeSliceLimiter` (``fail_closed``,
reporting every 0.2 s from its background thread). Four async workers call them in a loop; Redis
is stopped by SIGTERM for 1.5 s and restarted on the same port. Checked: no exception reaches a
caller; each limiter gives its mode's answer from the first failure on, within one breaker
window of the stop; the local fallback holds this process's share of the limit; and every
limiter returns to Redis by itself after the restart, with one ``store_down`` and one
``store_up`` event. Figures go to stdout (``-s``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from floodwall import Event
from floodwall.ratelimit import Decision
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.shared.leasing import LeasedLimiter
from floodwall.shared.timeslice import TimeSliceLimiter
from floodwall.stores import StoreErrorMode, connect
from servers import FAULT_OPEN, RestartableRedis, store_breaker

pytestmark = pytest.mark.integration

OPEN = FAULT_OPEN
DOWN = 1.5
SHARE = 4
"""``expected_instances``: the local fallback keeps 1/4 of the limit."""


Limiter = GlobalLimiter | LeasedLimiter | TimeSliceLimiter


async def test_redis_outage_and_recovery_under_load(restartable_redis: RestartableRedis) -> None:
    store = connect(restartable_redis.url)
    events: list[tuple[float, Event]] = []

    def listen(event: Event) -> None:
        events.append((time.monotonic(), event))

    common: dict[str, Any] = {"store": store, "listeners": [listen], "expected_instances": SHARE}
    modes: tuple[StoreErrorMode, ...] = ("fail_open", "fail_closed", "local")
    limiters: dict[str, Limiter] = {
        f"global-{mode}": GlobalLimiter(
            "gcra", "2000/s", name=f"global-{mode}", on_store_error=mode,
            breaker=store_breaker(mode), **common,
        )
        for mode in modes
    }  # fmt: skip
    limiters["leased-local"] = LeasedLimiter(
        "gcra", "2000/s", name="leased-local", lease=20, breaker=store_breaker("leased"), **common
    )
    timeslice = TimeSliceLimiter(
        "100000/s", name="timeslice", slice_length=0.2, on_store_error="fail_closed",
        breaker=store_breaker("timeslice"), **common,
    )  # fmt: skip
    limiters["timeslice-fail_closed"] = timeslice
    decisions: list[tuple[float, str, Decision, float, str]] = []
    escaped: list[BaseException] = []
    stop_load = asyncio.Event()

    async def worker() -> None:
        while not stop_load.is_set():
            for name, limiter in limiters.items():
                start = time.monotonic()
                try:
                    decision = await limiter.acquire_async()
                except BaseException as exc:
                    escaped.append(exc)
                    raise
                decisions.append(
                    (start, name, decision, time.monotonic() - start, limiter.guard.state)
                )
            await asyncio.sleep(0.001)

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    try:
        await asyncio.sleep(0.5)
        stopped_at = time.monotonic()
        await asyncio.to_thread(restartable_redis.stop)
        down_at = time.monotonic()
        await asyncio.sleep(DOWN)
        restart_began = time.monotonic()  # Redis may answer before start() returns
        await asyncio.to_thread(restartable_redis.start)
        restarted_at = time.monotonic()
        await asyncio.sleep(1.0)
    finally:
        stop_load.set()
        await asyncio.gather(*workers, return_exceptions=True)
        timeslice.close()
        await store.aclose()

    assert escaped == []
    before = [d for t, _, d, _, _ in decisions if t < stopped_at]
    assert before and all(d.allowed for d in before)
    figures = []
    for name, limiter in limiters.items():
        mine = [(t, d, took, state) for t, n, d, took, state in decisions if n == name]
        degraded = [t for t, _, _, state in mine if state == "down" and t > stopped_at]
        first = min(degraded) - stopped_at
        assert first < (down_at - stopped_at) + OPEN + 0.5, (name, first)
        during = [(t, d) for t, d, _, _ in mine if min(degraded) < t < restart_began]
        admitted = sum(d.allowed for _, d in during)
        if name == "global-fail_open":
            assert admitted == len(during)
        elif name == "global-fail_closed":
            assert admitted == 0
        elif name == "timeslice-fail_closed":
            # refuses everything from its first failed report (at most one slice late)
            late = [d for t, d in during if t > min(degraded) + 0.2 + 0.05]
            assert late and not any(d.allowed for d in late)
        slowest = max(took for t, _, took, _ in mine if stopped_at < t < restart_began)
        if name.endswith("-local"):  # this process's share: 500/s with a burst of 500
            span = during[-1][0] - during[0][0] + slowest  # decisions end after they start
            leased = 2 * 20  # a lease taken before the outage, and one's rounding
            assert admitted <= 2000 / SHARE * (1 + span) + leased, (name, admitted, span)
        guard = limiter.guard
        assert guard.state == "up" and guard.outages == 1 and guard.recoveries == 1, name
        assert guard.failures <= 3 + round(DOWN / OPEN) + 2, (name, guard.snapshot())
        figures.append(
            f"{name}: first degraded answer {1000 * first:.0f} ms after SIGTERM, slowest "
            f"decision while down {1000 * slowest:.1f} ms, {len(during)} decisions while down "
            f"({admitted} admitted), {guard.failures} failed store calls, "
            f"{guard.short_circuits} short-circuited"
        )
    after = [d for t, n, d, _, _ in decisions if t > restarted_at + 2 * OPEN + 0.3]
    assert after and all(d.allowed for d in after), "back on Redis, under the limits"
    downs = {e.name: t for t, e in events if e.kind == "store_down"}
    ups = {e.name: t for t, e in events if e.kind == "store_up"}
    assert set(downs) == set(ups) == set(limiters) - {"timeslice-fail_closed"} | {"timeslice"}
    back = {name: round(1000 * (t - restarted_at)) for name, t in ups.items()}
    assert all(ms < 1000 * (OPEN + 0.5) for name, ms in back.items() if name != "timeslice")
    assert back["timeslice"] < 1000 * (OPEN + 0.2 + 0.5), "its next report after the probe"
    assert timeslice.drop_rate == 0.0
    print("\n" + "\n".join(figures) + f"\nback on Redis after the restart (ms): {back}")
