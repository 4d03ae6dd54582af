"""One trace, three copies of each stored rate algorithm: the same verdicts, to the bit.

Each of the four algorithms is one step in ``floodwall/ratelimit/_steps.py``. The in-process
limiter runs it on its clock's seconds (floats, ``us_per_now = 1e6``), the store op runs it on a
store's whole microseconds (integers), and ``lua/ratelimit_*.lua`` mirrors it on Redis. Here the
same trace goes to all three:

* the local limiter (``FixedWindow``, ``SlidingWindowCounter``, ``TokenBucket``, ``GCRA``) on a
  :class:`FakeClock`;
* the op on ``memory://`` (its Python step), on the same clock;
* the production script on a real Redis started by the harness, its one clock line
  (``redis.call('TIME')``) swapped for a read of the trace's time from a key beside the state,
  so the script decides at the same instants (nothing else in it changes); the expiry it sets
  is removed after each call, since Redis would apply it on its own real clock (a record kept
  past its expiry is back to fresh: it decides as no record does);

and every answer must be identical: the op's and the script's replies (the store's time and each
verdict), and the local :class:`Decision` (``allowed``, ``remaining``, ``reset_after``,
``retry_after``, ``limit``) equal to the one the verdict stands for, floats compared with ``==``.
Times move in steps of 1/64 s (15 625 µs, a float exactly); periods are any whole number of
µs (60 ms, 250 ms, 3 s, ... so windows end off the trace's grid), costs run past the limit (the
"never" retry). :class:`~floodwall.Frequency` runs the fixed-window trace too, and batches with
leases (store only) go to the op and the script.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib.resources import files

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.ratelimit import GCRA, FixedWindow, Rate, SlidingWindowCounter, TokenBucket
from floodwall.ratelimit._base import RateLimiter
from floodwall.shared import Frequency
from floodwall.shared._global_ops import Batch, Plan, decision, plan
from floodwall.stores import Arg, MemoryStore

pytestmark = pytest.mark.integration

KINDS = ["fixed_window", "sliding_window_counter", "token_bucket", "gcra"]
TICK = 15_625
"""µs per step of the trace: 1/64 s, which a float holds exactly."""
START = 1000.0
"""The clock at the first request: 10⁹ µs, on none of the periods' grids."""

Trace = list[tuple[int, int]]
traces = st.lists(
    st.tuples(st.sampled_from([0, 0, 0, 1, 2, 3, 5, 16, 64, 200]), st.integers(0, 7)),
    min_size=1,
    max_size=50,
)
"""``(steps of 1/64 s to wait, cost)``: mostly bursts, with gaps that close windows."""
rates = st.builds(Rate, st.integers(1, 6), st.sampled_from([0.06, 0.25, 0.5, 1.0, 1.5, 3.0]))
EXAMPLES = settings(max_examples=100, deadline=None)

Script = Callable[[str, int, Sequence[Arg]], Batch]
"""``script(key, now_us, args)``: the op's reply from Redis, decided at ``now_us``."""

CLOCK_LINE = "local t = redis.call('TIME')"
FAKE_CLOCK_LINE = "local t = redis.call('HMGET', KEYS[1] .. '#now', 's', 'us')"


@pytest.fixture(scope="module")
def scripts(redis_url: str) -> Iterator[Callable[[Plan], Script]]:
    """Each op's production script on the harness's Redis, deciding at a time the test sets."""
    client = redis.Redis.from_url(redis_url)
    shas: dict[str, str] = {}

    def script_of(p: Plan) -> Script:
        name = p.op.script
        if name not in shas:
            source = files("floodwall.stores").joinpath(f"lua/{name}.lua").read_text()
            assert source.count(CLOCK_LINE) == 1, f"{name}.lua reads TIME once"
            shas[name] = client.script_load(source.replace(CLOCK_LINE, FAKE_CLOCK_LINE))

        def run(key: str, now_us: int, args: Sequence[Arg]) -> Batch:
            seconds, micros = divmod(now_us, 1_000_000)
            pipe = client.pipeline(transaction=False)
            pipe.hset(f"{key}#now", mapping={"s": seconds, "us": micros})
            pipe.evalsha(shas[name], 1, key, *args)
            pipe.persist(key)  # Redis expires on its real clock; the trace's runs ahead
            reply = pipe.execute()[1]
            return p.op.parse(reply)

        return run

    try:
        yield script_of
    finally:
        client.close()


def local_limiter(
    kind: str, rate: Rate, burst: int | None, initial: int | None, clock: fw.FakeClock
) -> RateLimiter[object]:
    limiter: RateLimiter[object]
    if kind == "fixed_window":
        limiter = FixedWindow(rate, clock=clock)  # type: ignore[assignment]
    elif kind == "sliding_window_counter":
        limiter = SlidingWindowCounter(rate, clock=clock)  # type: ignore[assignment]
    elif kind == "token_bucket":
        limiter = TokenBucket(rate, burst=burst, initial=initial, clock=clock)  # type: ignore[assignment]
    else:
        limiter = GCRA(rate, burst=burst, clock=clock)  # type: ignore[assignment]
    return limiter


def _now_us(clock: fw.FakeClock) -> int:
    now_us = round(clock.monotonic() * 1_000_000)
    assert now_us / 1_000_000 == clock.monotonic(), "the trace stays on whole, exact µs"
    return now_us


@pytest.mark.parametrize("kind", KINDS)
@EXAMPLES
@given(rate=rates, burst=st.one_of(st.none(), st.integers(0, 4)), trace=traces)
def test_one_trace_gets_the_same_verdicts_from_the_limiter_the_op_and_the_script(
    scripts: Callable[[Plan], Script], kind: str, rate: Rate, burst: int | None, trace: Trace
) -> None:
    """Buckets start full. (With ``initial`` below capacity a stored key restarts at
    ``initial`` when its record expires, once full, and Redis expires keys on its real clock,
    not the trace's; the plain local bucket starts when it is built and never forgets.)"""
    if kind in {"fixed_window", "sliding_window_counter"}:
        burst = None
    clock = fw.FakeClock(START)
    local = local_limiter(kind, rate, burst, None, clock)
    p = plan(kind, rate, burst, None)
    memory = MemoryStore(clock=clock)
    script = scripts(p)
    key = f"trace:{uuid.uuid4().hex}"
    for steps, cost in trace:
        clock.advance(steps * TICK / 1_000_000)
        now_us = _now_us(clock)
        args: list[Arg] = [*p.params, cost, cost]
        expected = local.acquire(cost=cost)
        stored = memory.apply(p.op, key, args)
        scripted = script(key, now_us, args)
        assert stored == scripted, (now_us, cost, stored, scripted)
        got_now, [verdict] = stored
        assert got_now == now_us
        assert decision(verdict, p.limit) == expected, (now_us, cost, verdict, expected)


@EXAMPLES
@given(
    count=st.integers(1, 6),
    period=st.sampled_from([0.06, 0.25, 1.0, 3.0]),
    trace=st.lists(
        st.tuples(st.sampled_from([0, 0, 0, 1, 3, 16, 64, 200]), st.integers(1, 6)),
        min_size=1,
        max_size=50,
    ),
)
def test_frequency_is_the_fixed_window(
    scripts: Callable[[Plan], Script], count: int, period: float, trace: Trace
) -> None:
    """``Frequency(count, period)`` decides as ``FixedWindow(Rate(count, period))``, and its
    store calls are the fixed-window op's (the same script)."""
    rate = Rate(count, period)
    clock = fw.FakeClock(START)
    local = FixedWindow(rate, clock=clock)
    frequency = Frequency(count, period, store=MemoryStore(clock=clock), clock=clock)
    p = plan("fixed_window", rate, None, None)
    script = scripts(p)
    key = f"freq:{uuid.uuid4().hex}"
    for steps, wanted in trace:
        cost = min(wanted, count)  # Frequency takes costs in [1, limit]
        clock.advance(steps * TICK / 1_000_000)
        expected = local.acquire(cost=cost)
        got = frequency.allow(cost=cost)
        assert got.allowed == expected.allowed
        assert got.count == count - expected.remaining
        assert got.reset_after == expected.reset_after
        _, [verdict] = script(key, _now_us(clock), [*p.params, cost, cost])
        assert decision(verdict, count) == expected


@pytest.mark.parametrize("kind", KINDS)
@EXAMPLES
@given(
    rate=rates,
    batches=st.lists(
        st.tuples(
            st.sampled_from([0, 0, 1, 5, 64, 200]),
            st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_batches_and_leases_get_the_same_verdicts_from_the_op_and_the_script(
    scripts: Callable[[Plan], Script],
    kind: str,
    rate: Rate,
    batches: list[tuple[int, list[tuple[int, int]]]],
) -> None:
    """Leases take what a plain request could; a batch decides at one instant."""
    clock = fw.FakeClock(START)
    p = plan(kind, rate, None, None)
    memory = MemoryStore(clock=clock)
    script = scripts(p)
    key = f"lease:{uuid.uuid4().hex}"
    for steps, requests in batches:
        clock.advance(steps * TICK / 1_000_000)
        pairs = [x for least, extra in requests for x in (least, least + extra)]
        args: list[Arg] = [*p.params, *pairs]
        stored = memory.apply(p.op, key, args)
        assert stored == script(key, _now_us(clock), args), (requests, stored)
        assert len(stored[1]) == len(requests)
