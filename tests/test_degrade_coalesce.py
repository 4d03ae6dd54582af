"""Coalesce: writes to one key within a window become one call; order per key is kept, even
across failed flushes."""

from __future__ import annotations

import asyncio
import operator
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import floodwall as fw
from floodwall.degrade import BacklogFullError, Coalesce


class Sink:
    """The downstream: records each call; fails while ``down``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []
        self.down = False

    def __call__(self, key: Any, value: Any) -> None:
        if self.down:
            raise ConnectionError("database down")
        self.calls.append((key, value))


def test_writes_within_a_window_become_one_call(clock: fw.FakeClock) -> None:
    sink = Sink()
    events: list[fw.Event] = []
    likes = Coalesce(sink, window=1.0, merge=operator.add, clock=clock, listeners=[events.append])
    for _ in range(1000):
        likes.submit("post:1", 1)
    likes.submit("post:2", 5)
    clock.advance(0.5)
    assert likes.flush() == [] and sink.calls == []
    clock.advance(0.5)
    likes.flush()
    assert sink.calls == [("post:1", 1000), ("post:2", 5)]
    assert (likes.submitted, likes.flushes, likes.merged) == (1001, 2, 999)
    assert [e.figures["writes"] for e in events] == [1000, 1]
    likes.submit("post:1", 1)  # a new window
    clock.advance(1.0)
    likes.flush()
    assert sink.calls[-1] == ("post:1", 1)


def test_last_write_wins_by_default(clock: fw.FakeClock) -> None:
    sink = Sink()
    profile = Coalesce(sink, window=0.2, clock=clock)
    for name in ("ann", "anne", "annie"):
        profile.submit("user:7:name", name)
    clock.advance(0.2)
    profile.flush()
    assert sink.calls == [("user:7:name", "annie")]


def test_a_failed_batch_goes_back_in_front_of_newer_writes(clock: fw.FakeClock) -> None:
    sink = Sink()
    log = Coalesce(sink, window=1.0, merge=operator.add, clock=clock)
    log.submit("k", [1, 2])
    clock.advance(1.0)
    sink.down = True
    (flushed,) = log.flush()
    assert isinstance(flushed.exception, ConnectionError)
    log.submit("k", [3])
    sink.down = False
    clock.advance(1.0)
    log.flush()
    assert sink.calls == [("k", [1, 2, 3])]
    assert (log.failed, log.requeued) == (1, 1)


def test_drop_on_error_gives_the_batch_up(clock: fw.FakeClock) -> None:
    sink = Sink()
    sink.down = True
    counter = Coalesce(sink, window=0.1, merge=operator.add, on_error="drop", clock=clock)
    counter.submit("views", 10)
    clock.advance(0.1)
    counter.flush()
    assert counter.pending == 0 and counter.dropped == 1


def test_bounded_keys(clock: fw.FakeClock) -> None:
    bounded = Coalesce(Sink(), max_keys=2, clock=clock)
    bounded.submit("a", 1)
    bounded.submit("b", 1)
    bounded.submit("a", 2)  # an existing key still merges
    with pytest.raises(BacklogFullError, match="2 keys already have pending writes") as caught:
        bounded.submit("c", 1)
    assert caught.value.kind == "backlog_full" and bounded.rejected == 1
    assert len(bounded.flush_all()) == 2


def test_flushes_go_through_the_policy(clock: fw.FakeClock) -> None:
    attempts = {"n": 0}

    def flaky(key: str, value: int) -> None:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise ConnectionError

    retry = fw.Retry("flush", attempts=2, backoff=fw.backoff.NoBackoff(), budget=None, clock=clock)
    views = Coalesce(flaky, policy=retry, merge=operator.add, clock=clock)
    views.submit("v", 1)
    views.submit("v", 1)
    (flushed,) = views.flush_all()
    assert flushed.exception is None and attempts["n"] == 2


async def test_async_flush_and_background_loop(clock: fw.FakeClock) -> None:
    seen: list[tuple[str, int]] = []

    async def write(key: str, value: int) -> None:
        seen.append((key, value))

    counter = Coalesce(write, window=1.0, merge=operator.add, clock=clock)
    task = asyncio.create_task(counter.run_async())
    await asyncio.sleep(0)
    counter.submit("a", 1)
    counter.submit("a", 2)
    for _ in range(3):
        clock.advance(1.0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert seen == [("a", 3)]
    counter.submit("b", 5)
    counter.stop()
    clock.advance(1.0)
    await asyncio.wait_for(task, 1)
    assert seen == [("a", 3), ("b", 5)], "stopping flushes what is pending"


# -- ordering, against the model ---------------------------------------------------------------

ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from("abc")),
        st.tuples(st.just("advance"), st.sampled_from([0.3, 0.6, 1.0])),
        st.tuples(st.just("flush"), st.booleans()),  # the boolean: is the downstream down?
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ACTIONS)
def test_coalesce_preserves_order_per_key_and_loses_nothing(actions: list[Any]) -> None:
    """With list concatenation as the merge: for every key, the flushed batches concatenated
    are exactly the submitted values in submission order; each batch is a contiguous run of
    them; failed batches are retried, never reordered or lost."""
    clock = fw.FakeClock(0.0)
    sink = Sink()
    coalesce: Coalesce[str, list[int]] = Coalesce(sink, window=1.0, merge=operator.add, clock=clock)
    submitted: defaultdict[str, list[int]] = defaultdict(list)
    for number, (action, arg) in enumerate(actions):
        if action == "submit":
            coalesce.submit(arg, [number])
            submitted[arg].append(number)
        elif action == "advance":
            clock.advance(arg)
        else:
            sink.down = arg
            coalesce.flush()
    sink.down = False
    coalesce.flush_all()
    flushed: defaultdict[str, list[int]] = defaultdict(list)
    for key, batch in sink.calls:
        flushed[key].extend(batch)
    assert flushed == submitted
    assert coalesce.pending == 0
    assert coalesce.flushes + coalesce.merged == coalesce.submitted
