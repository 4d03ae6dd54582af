"""Pipelines: the first policy is the outermost, in both shells."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import pytest

import floodwall as fw
from conftest import Shell
from floodwall import CircuitBreaker, Fallback, Pipeline, Policy, Timeout

P = ParamSpec("P")
R = TypeVar("R")


class Trace(Policy):
    """Records when it is entered and left, to observe the nesting order."""

    kind = "trace"

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        self.log.append(f"enter {self.name}")
        try:
            return fn(*args, **kwargs)
        finally:
            self.log.append(f"leave {self.name}")

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        self.log.append(f"enter {self.name}")
        try:
            return await fn(*args, **kwargs)
        finally:
            self.log.append(f"leave {self.name}")


def test_first_policy_is_outermost(shell: Shell) -> None:
    log: list[str] = []
    pipeline = Pipeline(Trace("a", log), Trace("b", log), Trace("c", log))

    def body() -> str:
        log.append("call")
        return "done"

    assert shell.run(pipeline, body) == "done"
    assert log == ["enter a", "enter b", "enter c", "call", "leave c", "leave b", "leave a"]


def test_fallback_outside_breaker_answers_rejections(shell: Shell, clock: fw.FakeClock) -> None:
    breaker = CircuitBreaker("dep", minimum_calls=2, clock=clock)
    pipeline = Pipeline(Fallback(value="cached"), breaker, Timeout(1.0, clock=clock))

    def down() -> str:
        raise ConnectionError

    assert [shell.run(pipeline, down) for _ in range(3)] == ["cached"] * 3
    assert breaker.state is fw.CircuitState.OPEN
    assert breaker.rejected == 1  # the third call never reached the dependency


def test_breaker_outside_fallback_sees_only_successes(shell: Shell, clock: fw.FakeClock) -> None:
    """Order matters: a fallback inside the breaker hides the failures from it."""
    breaker = CircuitBreaker("dep", minimum_calls=2, clock=clock)
    pipeline = Pipeline(breaker, Fallback(value="cached"))

    def down() -> str:
        raise ConnectionError

    for _ in range(5):
        shell.run(pipeline, down)
    assert breaker.state is fw.CircuitState.CLOSED


def test_timeout_inside_breaker_counts_as_timeout(clock: fw.FakeClock) -> None:
    breaker = CircuitBreaker("dep", minimum_calls=1, clock=clock)
    pipeline = Pipeline(breaker, Timeout(1.0, clock=clock))

    def slow() -> None:
        clock.advance(2.0)

    with pytest.raises(fw.TimeoutExceeded):
        pipeline.call(slow)
    assert breaker.metrics().timeouts == 1  # counted as a timeout, which tripped it
    assert breaker.state is fw.CircuitState.OPEN


def test_pipeline_prints_its_order(clock: fw.FakeClock) -> None:
    pipeline = Pipeline(
        Fallback(value=None), CircuitBreaker("pay", clock=clock), Timeout(2.0), name="payments"
    )
    assert str(pipeline) == (
        "Fallback(value=None) -> CircuitBreaker('pay', failure_rate=0.5, minimum_calls=20, "
        "window=10s, open_duration=5s) -> Timeout(2s) -> call"
    )
    assert pipeline.describe().startswith("Pipeline('payments': Fallback(value=None) -> ")
    assert [p.kind for p in pipeline] == ["fallback", "circuit_breaker", "timeout"]
    assert len(pipeline) == 3


def test_pipelines_nest_and_decorate(clock: fw.FakeClock) -> None:
    log: list[str] = []
    inner = Pipeline(Trace("b", log))
    outer = Pipeline(Trace("a", log), inner)

    @outer
    def work(x: int) -> int:
        return x * 2

    @outer
    async def awork(x: int) -> int:
        return x * 3

    assert work(2) == 4
    assert asyncio.run(awork(2)) == 6
    assert log == ["enter a", "enter b", "leave b", "leave a"] * 2


def test_only_policies_are_accepted() -> None:
    with pytest.raises(fw.ConfigError, match=r"policies\[1\] must be a floodwall Policy"):
        Pipeline(Fallback(value=1), "retry")  # type: ignore[arg-type]


def test_empty_pipeline_just_calls() -> None:
    assert Pipeline().call(lambda: 5) == 5
    assert str(Pipeline()) == "call"


def test_arguments_flow_through(shell: Shell) -> None:
    pipeline = Pipeline(Fallback(value=-1), CircuitBreaker())

    def plus(a: int, b: int = 0) -> int:
        return a + b

    assert pipeline.call(plus, 1, b=2) == 3

    async def add(a: int, b: int = 0) -> int:
        return a + b

    assert asyncio.run(pipeline.call_async(add, 1, b=5)) == 6
