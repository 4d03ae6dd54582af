"""Open-loop arrival schedules: shapes, bounds, mix, determinism (no servers, no clock)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from floodwall.drill.load import arrivals
from floodwall.drill.scenario import LoadSpec, RouteSpec

ROUTES = (
    RouteSpec(path="/a", calls=("x",)),
    RouteSpec(path="/b", calls=("y",)),
    RouteSpec(path="/w", method="POST", calls=("y",)),
)


def load(**fields: Any) -> LoadSpec:
    return LoadSpec.model_validate({"duration": 10, **fields})


def test_poisson_at_a_constant_rate() -> None:
    schedule = arrivals(load(rate=200), ROUTES, seed=1)
    assert 1800 <= len(schedule) <= 2200  # 2000 expected; sd about 45
    times = [a.t for a in schedule]
    assert times == sorted(times)
    assert times[0] >= 0 and times[-1] < 10
    assert [a.id for a in schedule] == list(range(1, len(schedule) + 1))


def test_the_same_seed_gives_the_same_schedule() -> None:
    first = arrivals(load(rate=50), ROUTES, seed=7)
    assert first == arrivals(load(rate=50), ROUTES, seed=7)
    assert first != arrivals(load(rate=50), ROUTES, seed=8)


def test_uniform_arrivals_are_evenly_spaced() -> None:
    schedule = arrivals(load(rate=10, arrivals="uniform"), ROUTES, seed=1)
    assert len(schedule) == 100
    gaps = {round(b.t - a.t, 9) for a, b in itertools.pairwise(schedule)}
    assert gaps == {0.1}


def test_a_ramp_puts_more_arrivals_late() -> None:
    schedule = arrivals(load(ramp={"from": 10, "to": 190}), ROUTES, seed=1)
    early = sum(a.t < 5 for a in schedule)
    late = len(schedule) - early
    assert 900 <= len(schedule) <= 1100  # mean rate 100/s
    assert late > 2 * early  # 55/s vs 145/s on average


def test_a_spike() -> None:
    spec = load(spike={"base": 20, "peak": 300, "at": 4, "for": 2})
    schedule = arrivals(spec, ROUTES, seed=1)
    inside = sum(4 <= a.t < 6 for a in schedule)
    outside = len(schedule) - inside
    assert 500 <= inside <= 700  # 600 expected
    assert 120 <= outside <= 200  # 160 expected


def test_bounded_by_count() -> None:
    schedule = arrivals(load(rate=1000, max_requests=123), ROUTES, seed=1)
    assert len(schedule) == 123
    assert schedule[-1].t < 0.3


def test_the_mix_weights_routes() -> None:
    schedule = arrivals(load(rate=500, mix={"/a": 3, "/b": 1}), ROUTES, seed=1)
    counts = Counter(a.route.path for a in schedule)
    assert counts["/w"] == 0
    assert 2.6 <= counts["/a"] / counts["/b"] <= 3.4
    even = Counter(a.route.path for a in arrivals(load(rate=500), ROUTES, seed=1))
    assert set(even) == {"/a", "/b", "/w"}
    assert max(even.values()) / min(even.values()) < 1.2
