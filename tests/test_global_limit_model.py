"""The global limiters' ops against the in-memory algorithms, decision for decision.

A :class:`GlobalLimiter` on a memory store driven by a :class:`FakeClock` runs the ops, whose
arithmetic is the algorithms' steps (:mod:`floodwall.ratelimit._steps`), the same the in-memory
limiters of :mod:`floodwall.ratelimit` run; those are checked against exact reference models in
``tests/test_ratelimit_algorithms.py``, and ``tests/integration/test_rate_steps.py`` adds the
Lua scripts on a real Redis. Here: same traces, the same decisions and figures to the bit.
Traces are ``(dt in 1/64 s, cost)`` as there, so every time is a whole number of microseconds.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.ratelimit import GCRA, FixedWindow, Rate, SlidingWindowCounter, TokenBucket
from floodwall.ratelimit._base import RateLimiter
from floodwall.shared._global_ops import ALGORITHMS, plan
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.stores import MemoryStore
from floodwall.stores.base import Arg

Trace = list[tuple[int, int]]

bursty = st.lists(
    st.tuples(st.sampled_from([0, 0, 0, 1, 8, 32, 64, 200]), st.integers(0, 3)),
    min_size=1,
    max_size=60,
)
rates = st.builds(Rate, st.integers(1, 6), st.sampled_from([0.5, 1.0, 2.0, 4.0]))
bursts = st.one_of(st.none(), st.integers(0, 5))
EXAMPLES = settings(max_examples=120, deadline=None)
KINDS = ["fixed_window", "sliding_window_counter", "token_bucket", "gcra"]


def in_memory(kind: str, rate: Rate, burst: int | None, clock: fw.FakeClock) -> RateLimiter[object]:
    limiter: RateLimiter[object]
    if kind == "fixed_window":
        limiter = FixedWindow(rate, clock=clock)  # type: ignore[assignment]
    elif kind == "sliding_window_counter":
        limiter = SlidingWindowCounter(rate, clock=clock)  # type: ignore[assignment]
    elif kind == "token_bucket":
        limiter = TokenBucket(rate, burst=burst, clock=clock)  # type: ignore[assignment]
    else:
        limiter = GCRA(rate, burst=burst, clock=clock)  # type: ignore[assignment]
    return limiter


@pytest.mark.parametrize("kind", KINDS)
@EXAMPLES
@given(rate=rates, burst=bursts, trace=bursty)
def test_the_store_ops_decide_as_the_in_memory_algorithms(
    kind: str, rate: Rate, burst: int | None, trace: Trace
) -> None:
    if kind in {"fixed_window", "sliding_window_counter"}:
        burst = None
    clock = fw.FakeClock(1000.0)
    local = in_memory(kind, rate, burst, clock)
    shared = GlobalLimiter(kind, rate, burst=burst, store=MemoryStore(clock=clock), clock=clock)
    for dt, cost in trace:
        clock.advance(dt / 64)
        expected = local.acquire(cost=cost)
        got = shared.acquire(cost=cost)
        assert got == expected, (clock.monotonic(), cost, got, expected)  # one step: to the bit


def _state_after(kind: str, rate: Rate, history: Trace) -> tuple[MemoryStore, fw.FakeClock]:
    clock = fw.FakeClock(1000.0)
    store = MemoryStore(clock=clock)
    p = plan(kind, rate, None, None)
    for dt, cost in history:
        clock.advance(dt / 64)
        store.apply(p.op, "k", [*p.params, cost, cost])
    return store, clock


@pytest.mark.parametrize("kind", KINDS)
@EXAMPLES
@given(rate=rates, history=bursty, batch=st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_a_batch_decides_as_its_requests_one_after_another(
    kind: str, rate: Rate, history: Trace, batch: list[int]
) -> None:
    p = plan(kind, rate, None, None)
    one, _ = _state_after(kind, rate, history)
    many, _ = _state_after(kind, rate, history)
    pairs = [x for cost in batch for x in (cost, cost)]
    _, together = one.apply(p.op, "k", [*p.params, *pairs])
    apart = [many.apply(p.op, "k", [*p.params, cost, cost])[1][0] for cost in batch]
    assert together == apart


@pytest.mark.parametrize("kind", KINDS)
@EXAMPLES
@given(rate=rates, history=bursty, cmin=st.integers(0, 4), extra=st.integers(0, 6))
def test_a_lease_takes_the_most_that_a_plain_request_could(
    kind: str, rate: Rate, history: Trace, cmin: int, extra: int
) -> None:
    p = plan(kind, rate, None, None)
    cmax = cmin + extra
    store, _ = _state_after(kind, rate, history)
    _, [(allowed, granted, *_)] = store.apply(p.op, "k", [*p.params, cmin, cmax])
    fits = []
    for c in range(cmax + 1):
        probe, _ = _state_after(kind, rate, history)
        fits.append(probe.apply(p.op, "k", [*p.params, c, c])[1][0][0])
    most = max((c for c, ok in enumerate(fits) if ok), default=-1)
    assert allowed == (most >= cmin)
    assert granted == (most if allowed else 0)


@EXAMPLES
@given(
    rate=rates,
    trace=st.lists(
        st.tuples(
            st.sampled_from([0, 0, 0, 1, 8, 32, 64, 200]),
            st.integers(0, 3),
            st.sampled_from([0, 0, 0, 2]),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_the_fixed_window_short_path_answers_and_writes_as_the_generic_step(
    rate: Rate, trace: list[tuple[int, int, int]]
) -> None:
    """``FixedWindowOp.step_one`` inlines the step for a request already parsed (a tuple of
    arguments, as ``Frequency`` sends): the same replies and records as the generic path (a
    list), leases (``most`` above ``least``) included."""
    p = plan("fixed_window", rate, None, None)
    clock = fw.FakeClock(1000.0)
    short, generic = MemoryStore(clock=clock), MemoryStore(clock=clock)
    full = short.keys(p.op, "k")[0]
    for dt, cost, extra in trace:
        clock.advance(dt / 64)
        args: tuple[Arg, ...] = (*p.params, cost, cost + extra)
        assert short.apply(p.op, "k", args) == generic.apply(p.op, "k", list(args))
        assert short.raw(full) == generic.raw(full)


def test_gcra_units_make_the_emission_interval_whole() -> None:
    """3/s is one request per 333 333.3 µs: the op counts in ⅓ µs (scale 3), so T is exactly
    10^6 units and no rounding drift accumulates (the hypothesis rates above include 3/s)."""
    shared = GlobalLimiter("gcra", "3/s", burst=2)
    assert shared.plan.params == (b"3", b"1000000", b"3000000")  # scale, T, tau = T × capacity
    assert shared.window == 1.0 and shared.limit == 3


def test_every_algorithm_name_and_alias_is_accepted() -> None:
    for name, stable in ALGORITHMS.items():
        assert GlobalLimiter(name, "5/s").algorithm == stable


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("leaky", "5/s"), "algorithm must be one of"),
        (("fixed", "5/s", {"burst": 2}), "burst applies to token_bucket and gcra"),
        (("gcra", "5/s", {"initial": 2}), "initial applies to token_bucket"),
        (("token", "5/s", {"initial": 9}), "initial must be"),
        (("gcra", "5/s", {"burst": -1}), "burst must be an integer >= 0"),
        (("sliding", "10000000000/d"), "too large"),
        (("gcra", "5/s", {"expected_instances": 0}), "expected_instances"),
        (("gcra", "5/s", {"prefix": "x:", "store": MemoryStore()}), "prefix applies"),
        (("gcra", "5/s", {"on_store_error": "retry"}), "on_store_error must be one of"),
        (("gcra", "5/s", {"max_batch": 0}), "max_batch"),
    ],
)
def test_bad_options_are_config_errors_that_name_the_parameter(
    args: tuple[object, ...], match: str
) -> None:
    *positional, options = args if isinstance(args[-1], dict) else (*args, {})
    with pytest.raises(fw.ConfigError, match=match):
        GlobalLimiter(*positional, **options)  # type: ignore[arg-type]


def test_costs_must_be_whole_and_non_negative() -> None:
    limiter = GlobalLimiter("gcra", "5/s")
    with pytest.raises(ValueError, match="cost must be an integer >= 0"):
        limiter.acquire(cost=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost must be an integer >= 0"):
        limiter.acquire(cost=-1)
    assert limiter.acquire(cost=0).allowed
    refused = limiter.acquire(cost=6)
    assert not refused.allowed and refused.retry_after == math.inf
