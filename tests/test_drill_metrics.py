"""Every drill figure computed from a synthetic raw event log whose answers are known.

The log: routes ``/a -> x`` (healthy), ``/b -> y`` (faulty), ``/w -> pay`` (writes, healthy).
Requests on ``/a`` and ``/b`` every 0.1 s (at k/10 + 0.05 s) for 40 s; the fault on ``y`` lasts
from 10 s to 20 s. Each figure below is worked out by hand in its test.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from floodwall.drill.metrics import (
    CPU_WAIT_SPAN,
    RECOVERY_HOLD,
    RECOVERY_WINDOW,
    VOID_BASELINE,
    VOID_CPU_WAIT,
    VOID_LOOP_LAG,
    VOID_SEND_LAG,
    Action,
    Call,
    EventLog,
    FaultWindow,
    Request,
    Sample,
    Write,
    breaker_intervals,
    compute,
    cpu_wait_share,
    percentile,
    series,
)


def at(k: int) -> float:
    return round(k * 0.1 + 0.05, 6)


def healthy_request(k: int) -> Request:
    start = at(k)
    if 20 <= k < 100:  # before the fault: 50 ms, one slow request
        return Request(2 * k + 1, "/a", start, start + (0.2 if k == 50 else 0.05), 200)
    if 100 <= k < 200:  # during: 60 ms, one fast 503
        if k == 150:
            return Request(2 * k + 1, "/a", start, start + 0.01, 503)
        return Request(2 * k + 1, "/a", start, start + 0.06, 200)
    return Request(2 * k + 1, "/a", start, start + 0.05, 200)


def faulty_request(k: int, degraded_until: float = 23.0) -> Request:
    start = at(k)
    degraded = 10 <= start < degraded_until  # a fallback answers for y
    return Request(2 * k + 2, "/b", start, start + 0.03, 200, degraded=degraded)


def calls_for_b(k: int) -> int:
    if 100 <= k < 120:
        return 3  # retried twice
    if 120 <= k < 200:
        return 0  # the breaker kept them away
    return 1


ORDERS = [  # (order, status seen by the caller, times applied)
    ("o1", 200, 1),
    ("o2", 200, 2),  # doubled
    ("o3", 200, 0),  # lost
    ("o4", 0, 1),  # unconfirmed: the caller gave up, the money moved
    ("o5", 502, 0),
]


def make_log(degraded_until: float = 23.0) -> EventLog:
    requests = [healthy_request(k) for k in range(400)]
    requests += [faulty_request(k, degraded_until) for k in range(400)]
    calls = [Call("x", r.start, r.end, 200, r.id) for r in requests if r.route == "/a"]
    for k in range(400):
        rid = 2 * k + 2
        calls += [Call("y", at(k), at(k) + 0.02, 200, rid)] * calls_for_b(k)
    writes = []
    for index, (order, status, applied) in enumerate(ORDERS):
        rid = 10_000 + index
        start = 30.05 + index
        requests.append(Request(rid, "/w", start, start + 0.04, status, order=order))
        calls.append(Call("pay", start, start + 0.03, 200, rid))
        writes += [Write("pay", start + 0.02, order, None, rid)] * applied
    actions = [
        Action(9.0, "timeout", "timeout", "y"),  # before the fault: not a detection
        Action(10.2, "timeout", "timeout", "x"),  # not about the faulty dependency
        Action(10.7, "fallback", "fallback", "y.fallback", None, "timeout"),
        Action(11.0, "state_change", "circuit_breaker", "y", "OPEN"),
        Action(23.0, "state_change", "circuit_breaker", "y", "HALF_OPEN"),
        Action(23.05, "state_change", "circuit_breaker", "y", "CLOSED"),
    ]
    samples = [
        Sample(1.0, 5, 10, 50.0, 3, 0),
        Sample(12.0, 7, 30, 55.5, 100, 50),
        Sample(30.0, 6, 20, 52.0, 4, 0),
    ]
    return EventLog(
        routes={"/a": ("x",), "/b": ("y",), "/w": ("pay",)},
        timeout=2.0,
        warmup=2.0,
        load_end=40.0,
        end=41.0,
        requests=sorted(requests, key=lambda r: r.start),
        calls=calls,
        actions=actions,
        faults=[FaultWindow("y", 10.0, 20.0, "latency +5s")],
        samples=samples,
        writes=writes,
    )


def test_windows_and_routes() -> None:
    f = compute(make_log())
    assert f.requests == 805
    assert f.success_rate == pytest.approx(802 / 805)
    assert f.healthy_routes == ("/a", "/w")
    assert f.faulty == ("y",)
    assert (f.fault_start, f.fault_end) == (10.0, 20.0)


def test_blast_radius() -> None:
    f = compute(make_log())
    assert f.healthy_success_rate_before == 1.0  # 80 requests on /a in [2, 10)
    assert f.healthy_success_rate == 0.99  # 100 on /a in [10, 20), one 503
    assert f.healthy_p99_ms_before == pytest.approx(200.0)  # rank 80 of 80: the slow one
    assert f.healthy_p99_ms_during == pytest.approx(60.0)  # rank 99 of 100
    assert f.healthy_failures == {"503": 1}


def test_item7_first_protective_action_and_detection_are_two_figures() -> None:
    """Issue 19, item 7: a fallback 0.7 s in is the first protective action; the breaker
    opening 1.0 s in is the detection (the dependency taken out of the path)."""
    f = compute(make_log())
    assert f.first_action_s == pytest.approx(0.7)
    assert f.first_action_by == "fallback fallback[y.fallback]"
    assert f.detection_time_s == pytest.approx(1.0)
    assert f.detected_by == "state_change circuit_breaker[y] -> OPEN"


def test_detection_by_a_breaker_when_no_fallback_came_first() -> None:
    log = make_log()
    log.actions = [a for a in log.actions if a.kind != "fallback"]
    f = compute(log)
    assert f.first_action_s == f.detection_time_s == pytest.approx(1.0)
    assert f.detected_by == f.first_action_by == "state_change circuit_breaker[y] -> OPEN"
    log.actions = [a for a in log.actions if a.to_state != "OPEN"]
    f = compute(log)
    assert f.detection_time_s is None and f.first_action_s is None  # the x timeout is neither


def test_detection_by_shedding() -> None:
    log = make_log()
    log.actions = [a for a in log.actions if a.kind == "fallback"]
    log.actions.append(Action(12.5, "rejected", "load_shedder", "y", None, "overloaded"))
    f = compute(log)
    assert f.first_action_s == pytest.approx(0.7)
    assert f.detection_time_s == pytest.approx(2.5)
    assert f.detected_by == "rejected load_shedder[y]"
    log.actions.append(Action(11.5, "level_shed", "levels", "registry", None, "cpu"))
    assert compute(log).detection_time_s == pytest.approx(1.5)


def test_recovery_is_when_full_answers_are_back() -> None:
    f = compute(make_log())
    assert f.full_rate_before == 1.0
    # /b answered by its fallback until 22.95 s: the first 2 s window of arrivals without a
    # degraded answer starts at 23.0 s, 3.0 s after the fault ended.
    assert f.recovery_time_s == pytest.approx(3.0)
    assert compute(make_log(degraded_until=20.0)).recovery_time_s == 0.0
    assert compute(make_log(degraded_until=99.0)).recovery_time_s is None  # not in the run


def test_item7_recovery_must_hold_for_every_window() -> None:
    """Issue 19, item 7: full answers back for one 2 s window, then lost again for a moment,
    is not a recovery: it counts from when they are back for RECOVERY_HOLD windows."""
    log = make_log(degraded_until=20.0)
    relapse = {at(k) for k in range(225, 230)}  # 22.55 .. 22.95 s: five degraded answers
    log.requests = [
        dataclasses.replace(r, degraded=True) if r.route == "/b" and r.start in relapse else r
        for r in log.requests
    ]
    assert RECOVERY_HOLD == 2 and RECOVERY_WINDOW == 2.0
    # [20, 22) is back, but [22, 24) is not; the first t whose [t, t+2) and [t+2, t+4) both
    # hold starts after the relapse: 23.0 s, 3.0 s after the fault ended.
    assert compute(log).recovery_time_s == pytest.approx(3.0)


def test_recovery_tolerates_one_percentage_point() -> None:
    log = make_log(degraded_until=20.0)
    # one degraded answer in a 2 s window of 40 arrivals is 2.5 points: not recovered yet
    log.requests = [
        dataclasses.replace(r, degraded=True) if r.route == "/b" and r.start == at(205) else r
        for r in log.requests
    ]
    assert compute(log).recovery_time_s == pytest.approx(0.6)


def test_the_ledger_audit() -> None:
    f = compute(make_log())
    assert f.accepted_writes == 3
    assert f.applied_writes == 4
    assert f.doubled_writes == 1
    assert f.lost_writes == 1
    assert f.unconfirmed_writes == 1
    assert f.audit == {
        "pay": {
            "orders": 5,
            "applied": 4,
            "doubled": 1,
            "lost": 1,
            "unconfirmed": 1,
            "doubled_orders": ["o2"],
            "lost_orders": ["o3"],
            "unconfirmed_orders": ["o4"],
        }
    }


def two_ledgers() -> EventLog:
    """``/order`` writes each order to inventory and to analytics; analytics lost o2 and o3
    although the callers were told they succeeded, inventory applied o4 twice, and o5 was
    charged on inventory while its caller was told it failed."""
    told = {"o1": 200, "o2": 200, "o3": 200, "o4": 200, "o5": 502}
    requests = [
        Request(i, "/order", float(i), i + 0.1, status, order=order)
        for i, (order, status) in enumerate(told.items())
    ]
    applied = {"inventory": ["o1", "o2", "o3", "o4", "o4", "o5"], "analytics": ["o1", "o4"]}
    writes = [
        Write(service, float(i), order)
        for service, orders in applied.items()
        for i, order in enumerate(orders)
    ]
    return EventLog(
        routes={"/order": ("inventory", "analytics")},
        timeout=1.0,
        warmup=0.0,
        load_end=6.0,
        end=6.0,
        requests=requests,
        writes=writes,
    )


def test_item6_the_write_audit_is_per_ledger_and_per_key() -> None:
    """Issue 19, item 6: an order written once to inventory and once to analytics is not
    doubled; lost writes on one ledger while callers were told success show, on that ledger."""
    f = compute(two_ledgers())
    inventory, analytics = f.audit["inventory"], f.audit["analytics"]
    assert (inventory["doubled_orders"], inventory["lost_orders"]) == (["o4"], [])
    assert inventory["unconfirmed_orders"] == ["o5"]
    assert (analytics["doubled_orders"], analytics["lost_orders"]) == ([], ["o2", "o3"])
    assert analytics["unconfirmed_orders"] == []
    assert (inventory["orders"], inventory["applied"]) == (5, 6)
    assert (analytics["orders"], analytics["applied"]) == (5, 2)
    assert (f.doubled_writes, f.lost_writes, f.unconfirmed_writes) == (1, 2, 1)
    assert (f.accepted_writes, f.applied_writes) == (4, 8)


def test_item7_a_load_sent_late_voids_the_run() -> None:
    """Issue 19, item 7: when the load generator fell behind (more than 1 % of arrivals sent
    over a tenth of the caller's timeout late) or the event loop stalled (a quarter of it), the
    run's figures are void, and say why."""
    log = make_log()
    assert compute(log).void is None
    late = [dataclasses.replace(r, late=0.3) if r.id % 50 == 0 else r for r in log.requests]
    f = compute(dataclasses.replace(log, requests=late))
    assert f.send_lag_p99_ms == pytest.approx(300.0)
    assert f.void is not None and "load generator sent its arrivals late (300 ms" in f.void
    assert "more than 200 ms" in f.void  # the caller's timeout is 2 s
    near = [dataclasses.replace(r, late=0.19) if r.id % 50 == 0 else r for r in log.requests]
    assert compute(dataclasses.replace(log, requests=near)).void is None
    stalled = dataclasses.replace(log, samples=[*log.samples, Sample(15.0, 5, 10, 50.0, 0, 0, 0.8)])
    f = compute(stalled)
    assert f.void is not None and "event loop fell 800 ms behind (more than 500 ms)" in f.void
    assert VOID_SEND_LAG == 0.1 and VOID_LOOP_LAG == 0.25


def failing(log: EventLog, route: str, ks: range) -> EventLog:
    """``log`` with the requests on ``route`` that arrived at ``at(k)`` for ``k`` in ``ks``
    timed out (status 0, the caller's 2 s timeout)."""
    starts = {at(k) for k in ks}
    requests = [
        dataclasses.replace(r, end=r.start + 2.0, status=0)
        if r.route == route and r.start in starts
        else r
        for r in log.requests
    ]
    return dataclasses.replace(log, requests=requests)


def test_a_baseline_that_failed_before_the_fault_voids_the_run() -> None:
    """The healthy routes failed over 5 % of their requests before the first fault while the
    load generator and the event loop kept up (the services starved at start-up on a busy
    machine): no baseline, so the run is void; failures in the warmup, on the faulty route or
    without any fault do not count."""
    log = make_log()  # 80 requests on /a in [warmup 2 s, fault 10 s)
    assert compute(failing(log, "/a", range(20, 24))).void is None  # 4 of 80: 5 %, not over
    f = compute(failing(log, "/a", range(20, 32)))  # 12 of 80: 15 %, the CI run's share
    assert f.healthy_success_rate_before == pytest.approx(68 / 80)
    assert f.send_lag_p99_ms == 0.0 and f.peak_loop_lag_ms == 0.0  # the load kept up
    assert f.void is not None
    assert "healthy routes failed 12 of their 80 requests before any fault (15 %" in f.void
    assert "more than 5 %" in f.void
    assert compute(failing(log, "/a", range(20))).void is None  # the warmup's
    assert compute(failing(log, "/b", range(20, 100))).void is None  # the faulty route's
    faultless = dataclasses.replace(failing(log, "/a", range(20, 32)), faults=[])
    assert compute(faultless).void is None  # no fault: nothing to compare with a baseline
    assert VOID_BASELINE == 0.05


def waited(log: EventLog, starved: dict[tuple[float, float], float]) -> EventLog:
    """``log`` with a sample every 0.25 s whose threads waited 0.1 s for a core per second (a
    quiet machine), ``starved[(start, end)]`` per second from ``start`` to ``end`` instead."""
    samples, total = [], 0.0
    for k in range(161):
        t = k * 0.25
        samples.append(Sample(t, 5, 10, 50.0, cpu_wait=total))
        rate = next((r for (lo, hi), r in starved.items() if lo <= t < hi), 0.1)
        total += rate * 0.25
    return dataclasses.replace(log, samples=samples)


def test_a_run_that_waited_for_a_core_is_void() -> None:
    """The machine took the CPU away: the run's threads, ready to run, waited over half of a
    second for a core (run-queue wait) before or during the fault, though the event loop's lag
    and the load generator stayed within their bounds. The worst second counts: 3 s at 0.8 in a
    10 s fault at 0.1 otherwise is 0.31 over the fault, and is the reproduction's p99 growth."""
    quiet = compute(waited(make_log(), {}))
    assert quiet.cpu_wait_share_before == pytest.approx(0.1)
    assert quiet.cpu_wait_share_during == pytest.approx(0.1)
    assert quiet.void is None
    f = compute(waited(make_log(), {(14.0, 17.0): 0.8}))
    assert (f.peak_loop_lag_ms, f.send_lag_p99_ms) == (0.0, 0.0)
    assert f.cpu_wait_share_during == pytest.approx(0.8)
    assert f.cpu_wait_share_before == pytest.approx(0.1)
    assert f.void is not None
    assert "waited for a core 800 ms in a second during the fault (more than 500 ms)" in f.void
    before = compute(waited(make_log(), {(4.0, 5.5): 0.6}))
    assert before.cpu_wait_share_before == pytest.approx(0.6)
    assert before.void is not None and "600 ms in a second before the fault" in before.void
    assert compute(waited(make_log(), {(14.0, 17.0): 0.45})).void is None  # under the bound
    assert compute(waited(make_log(), {(0.0, 2.0): 0.9})).void is None  # the warmup's
    assert compute(waited(make_log(), {(25.0, 30.0): 0.9})).void is None  # after the fault
    faultless = dataclasses.replace(waited(make_log(), {(25.0, 30.0): 0.9}), faults=[])
    f = compute(faultless)  # no fault: the load after warm-up is the one window
    assert f.cpu_wait_share_before == pytest.approx(0.9) and f.cpu_wait_share_during is None
    assert f.void is not None and "900 ms in a second under load" in f.void
    assert VOID_CPU_WAIT == 0.5 and CPU_WAIT_SPAN == 1.0


def test_cpu_wait_needs_two_samples_that_say() -> None:
    """Without ``/proc`` (samples without ``cpu_wait``) the shares are ``None`` and do not void
    the run; a span shorter than a second is taken whole."""
    log = make_log()  # its samples carry no cpu_wait
    f = compute(log)
    assert (f.cpu_wait_share_before, f.cpu_wait_share_during, f.void) == (None, None, None)
    short = waited(log, {(10.0, 10.5): 0.9})
    assert cpu_wait_share(short, 10.0, 10.5) == pytest.approx(0.9)  # 10.0 to 10.25
    assert cpu_wait_share(short, 10.0, 10.1) is None  # one sample


def test_amplification() -> None:
    f = compute(make_log())
    # during the fault: 20 requests x 3 calls + 80 x 0 calls, over 100 requests
    assert f.amplification == pytest.approx(0.6)
    # the whole run: 100 + 60 + 200 calls for 400 requests
    assert f.amplification_by_dependency == pytest.approx({"x": 1.0, "y": 0.9, "pay": 1.0})


def test_resources() -> None:
    f = compute(make_log())
    assert (f.peak_threads, f.peak_sockets, f.peak_rss_mb) == (7, 30, 55.5)
    assert (f.peak_workers_busy, f.peak_queued) == (100, 50)


def test_a_log_without_faults_or_writes() -> None:
    log = make_log()
    log.faults = []
    log.writes = []
    log.requests = [r for r in log.requests if r.order is None]
    f = compute(log)
    assert f.healthy_routes == ("/a", "/b", "/w")
    assert f.healthy_success_rate is None
    assert f.detection_time_s is None and f.recovery_time_s is None
    assert f.doubled_writes is None and f.lost_writes is None
    assert f.amplification is None
    # without a fault, "before" is everything after the warmup: 380 + 380 requests, one 503
    assert f.healthy_success_rate_before == pytest.approx(759 / 760)


def test_an_edge_fault_is_noticed_by_any_action() -> None:
    log = make_log()
    log.faults = [FaultWindow("edge", 10.0, 20.0, "reload gateway.yaml")]
    f = compute(log)
    assert f.first_action_s == pytest.approx(0.2)
    assert f.detection_time_s == pytest.approx(1.0)


def test_as_dict_is_plain_json_data() -> None:
    data = compute(make_log()).as_dict()
    assert data["healthy_routes"] == ["/a", "/w"]
    assert data["success_rate"] == round(802 / 805, 4)
    nan = dataclasses.replace(compute(make_log()), success_rate=math.nan)
    assert nan.as_dict()["success_rate"] is None


def test_breaker_intervals() -> None:
    spans = breaker_intervals(make_log().actions, 41.0)
    assert spans == {
        "y": [
            (0.0, 11.0, "CLOSED"),
            (11.0, 23.0, "OPEN"),
            (23.0, 23.05, "HALF_OPEN"),
            (23.05, 41.0, "CLOSED"),
        ]
    }


def test_series_bins() -> None:
    s = series(make_log(), step=0.5)
    assert len(s.t) == 82 and s.t[30] == 15.0
    # bin [15.0, 15.5): 5 requests on /a (one 503), 5 on /b answered by the fallback
    assert s.healthy_success[30] == pytest.approx(0.8)
    assert s.affected_success[30] == 1.0
    assert s.full_rate[30] == pytest.approx(0.4)
    assert s.throughput[30] == 20.0
    assert s.healthy_p99_ms[30] == pytest.approx(60.0)
    assert s.workers_busy[24] == 100 and s.workers_busy[2] == 3
    assert s.faults == [(10.0, 20.0, "y", "latency +5s")]
    assert s.breakers["y"][1] == (11.0, 23.0, "OPEN")
    assert s.as_dict()["step"] == 0.5


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.5) == 50.0
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.5) is None
