"""SampledDrop: the live-stream comments seen only by their sender; the ratio changes live."""

from __future__ import annotations

import random
from typing import Any

import pytest

import floodwall as fw
from floodwall.degrade import SampledDrop, key_fraction


def send_many(drop: SampledDrop, count: int, **kwargs: Any) -> int:
    delivered = 0

    def broadcast(message: str, **_: Any) -> str:
        nonlocal delivered
        delivered += 1
        return "sent"

    for i in range(count):
        drop.call(broadcast, f"comment {i}", **kwargs)
    return delivered


def test_the_ratio_changes_live() -> None:
    events: list[fw.Event] = []
    drop = SampledDrop(0.0, rng=random.Random(7), listeners=[events.append])
    assert send_many(drop, 1000) == 1000
    drop.set_ratio(0.9)  # the room is hot: the config centre raises the ratio
    delivered = send_many(drop, 1000)
    assert 60 <= delivered <= 140
    drop.set_ratio(1.0)
    assert send_many(drop, 100) == 0
    drop.set_ratio(0.25)
    assert 700 <= send_many(drop, 1000) <= 800
    assert drop.passed + drop.dropped == 3100
    assert [e.figures["ratio"] for e in events if e.kind == "ratio_changed"] == [0.9, 1.0, 0.25]
    assert sum(e.kind == "dropped" for e in events) == drop.dropped


def test_a_callable_ratio_is_read_on_every_call() -> None:
    config = {"danmaku.drop": 0.0}
    drop = SampledDrop(lambda: config["danmaku.drop"], rng=random.Random(1))
    assert send_many(drop, 100) == 100
    config["danmaku.drop"] = 1.0
    assert send_many(drop, 100) == 0
    config["danmaku.drop"] = 7.0  # a bad value from the config centre: keep the last good one
    assert send_many(drop, 10) == 0
    assert drop.ratio_errors == 10
    assert "ratio=live" in drop.describe()


def test_dropped_calls_answer_locally_and_are_marked(shell: Any) -> None:
    drop = SampledDrop(1.0, drop_factory=lambda: "shown to the sender only")
    with fw.call_context() as ctx:
        assert shell.run(drop, lambda: "broadcast") == "shown to the sender only"
    assert ctx.degraded_by == "sampled_drop" and ctx.degraded_reason == "sampled"
    assert SampledDrop(1.0, on_drop=None).call(lambda: "x") is None


def test_per_key_sampling_is_stable_and_monotone() -> None:
    users = [f"user-{i}" for i in range(2000)]
    low = SampledDrop(0.2, key=lambda user, **_: user)
    high = SampledDrop(0.5, key=lambda user, **_: user)
    dropped_low = {u for u in users if low.should_drop(u)}
    dropped_high = {u for u in users if high.should_drop(u)}
    assert dropped_low <= dropped_high, "raising the ratio only adds users"
    assert 0.15 <= len(dropped_low) / len(users) <= 0.25
    assert {u for u in users if low.should_drop(u)} == dropped_low, "stable"
    assert key_fraction("user-1") == key_fraction("user-1")


def test_only_matching_calls_are_sampled() -> None:
    drop = SampledDrop(1.0, when=lambda message, level=3: level == 3)
    assert drop.call(lambda message, level: "sent", "hi", level=1) == "sent"
    assert drop.call(lambda message, level: "sent", "hi", level=3) is None


def test_the_ratio_is_validated() -> None:
    with pytest.raises(fw.ConfigError, match=r"ratio must be a number in \[0, 1\], got 1.5"):
        SampledDrop(1.5)
    drop = SampledDrop(0.5)
    with pytest.raises(fw.ConfigError):
        drop.set_ratio(-0.1)
    assert drop.ratio == 0.5
