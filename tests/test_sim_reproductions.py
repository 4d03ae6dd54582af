"""The simulator reproduces the published behaviour (the issue's "done when" list).

1. concurrency-limits' gRPC example (Netflix/concurrency-limits, concurrency-limits-grpc/src/
   test/java/com/netflix/concurrency/limits/grpc/server/example/Example.java + TestServer.java):
   Gradient2 keeps ≥ 90 % goodput at 2× with p99 ≤ 3× the unloaded p99; no limiter collapses.
2. DAGOR (Zhou et al., SoCC 2018, figure "success rate vs feed rate"): success within 10 % of
   min(1, 1/x) and nearly equal across fan-outs; random shedding decays as (1/x)^k.
3. The seeds' payment post-mortem (004): timeouts + bulkhead + adaptive limit never exhaust the
   200-thread pool that the 8 s hangs pin when unprotected.

The fan-out and payment runs are shorter than in docs/overload.md (benchmarks/overload_sim.py
runs the full ones).
"""

from __future__ import annotations

import math

import pytest

from floodwall.sim import run_scenario
from floodwall.sim.library import fan_out, grpc_example, payment

CAPACITY = 100.0  # concurrency 2 / 20 ms


def test_grpc_example_gradient2_holds_goodput_and_latency() -> None:
    # the published 100 s phases (0.6 s to simulate): enough samples for a stable unloaded p99
    phases = dict(run_scenario(grpc_example(phase=100.0)).summaries())
    unloaded, overloaded = phases["0.5x"], phases["2x"]
    assert overloaded.goodput >= 0.9 * CAPACITY
    assert overloaded.p99 <= 3 * unloaded.p99
    assert overloaded.rejected > 0  # it sheds instead of queueing
    assert phases["1x"].goodput >= 0.85 * CAPACITY  # and recovers


def test_grpc_example_without_a_limiter_collapses() -> None:
    phases = dict(run_scenario(grpc_example(None, phase=40.0)).summaries())
    assert phases["0.9x"].goodput >= 0.85 * CAPACITY
    assert phases["2x"].goodput < 0.05 * CAPACITY  # queueing passed the 1 s client timeout
    assert phases["1x"].goodput < 0.05 * CAPACITY  # and the backlog never drains


@pytest.mark.parametrize("feed", [2.0, 4.0])
def test_dagor_fan_out_success_is_near_optimal_for_every_fan_out(feed: float) -> None:
    optimum = min(1.0, 1.0 / feed)
    rates = {}
    for k in (1, 4):
        ((_, summary),) = run_scenario(fan_out(feed, k, duration=70, warmup=40)).summaries()
        rates[k] = summary.success_rate
        assert abs(summary.success_rate - optimum) <= 0.1 * optimum, (k, summary.success_rate)
    assert abs(rates[1] - rates[4]) <= 0.05


def test_random_shedding_loses_fan_out_requests() -> None:
    ((_, summary),) = run_scenario(
        fan_out(2.0, 4, coherent=False, duration=70, warmup=40)
    ).summaries()
    assert summary.success_rate < 0.6 * 0.5  # far below 1/x; about (1/x)^k


def test_payment_pool_is_never_exhausted_when_protected() -> None:
    bare = run_scenario(payment(False, duration=40, clients=2000))
    safe = run_scenario(payment(True, duration=40, clients=2000))
    bare_busy = bare.recorder.series("busy", 40)
    safe_busy = safe.recorder.series("busy", 40)
    assert max(bare_busy) == 200  # the hangs pin every worker...
    assert sum(b >= 200 for b in bare_busy) >= 30  # ...within seconds, and for good
    assert max(safe_busy) < 200
    bare_all, safe_all = bare.overall(), safe.overall()
    assert safe_all.goodput > 1.5 * bare_all.goodput
    assert safe_all.p99 < 1.0 < bare_all.p99
    assert not math.isnan(safe_all.mean_limit)


@pytest.mark.parametrize(
    ("feed", "fanout", "share"), [(2.0, 1, 0.9), (2.0, 4, 0.85), (4.0, 1, 0.9), (4.0, 4, 0.8)]
)
def test_dagor_fan_out_measured_from_the_step(feed: float, fanout: int, share: float) -> None:
    """DAGOR (Zhou et al., SoCC 2018, figure "success rate vs feed rate"), counted from the
    moment the feed starts instead of after a warm-up: with the surge rule and the wait rule
    (whose overflow also counts as a surge, so that the level cuts to the service rate at once)
    it holds 85-95 % of the optimum min(1, 1/x) for fan-out 1 and 4 at 2x and 4x, where the
    paper's 5 %-per-window steps alone (no surge, no wait rule) lose most requests to the
    backlog (2-47 %). At 4x with fan-out 4 the surge rule alone kept 55 %, the wait rule's
    overflow 85 %."""
    optimum = min(1.0, 1.0 / feed)
    ((_, summary),) = run_scenario(fan_out(feed, fanout, duration=20, warmup=0)).summaries()
    assert summary.success_rate >= share * optimum, summary.success_rate
    paper = {"type": "dagor", "options": {"surge": 1000.0, "max_wait_ratio": None}}
    spec = fan_out(feed, fanout, guard=paper, duration=20, warmup=0)
    ((_, slow),) = run_scenario(spec).summaries()
    assert slow.success_rate < 0.5 * optimum
