# mypy: disable-error-code="comparison-overlap,unreachable"
# (tests read a property before and after acting; mypy assumes it cannot change)
"""Fallback: which failures it answers for, and how it says it answered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import floodwall as fw
from conftest import Shell
from floodwall import CircuitOpenError, CircuitState, Fallback, TimeoutExceeded


def raises(exc: BaseException) -> Any:
    def fn() -> Any:
        raise exc

    return fn


def test_value_answers_any_exception(shell: Shell) -> None:
    fallback: Fallback[list[int]] = Fallback(value=[])
    assert shell.run(fallback, raises(ValueError("x"))) == []
    assert shell.run(fallback, lambda: [1]) == [1]
    assert fallback.degraded == 1


def test_factory_gets_the_exception(shell: Shell) -> None:
    fallback = Fallback(factory=lambda exc: f"cached because {type(exc).__name__}")
    assert shell.run(fallback, raises(KeyError("k"))) == "cached because KeyError"


async def test_async_factory_is_awaited() -> None:
    async def backup(exc: BaseException) -> str:
        await asyncio.sleep(0)
        return "from backup"

    async def down() -> str:
        raise ConnectionError

    assert await Fallback(factory=backup).call_async(down) == "from backup"
    with pytest.raises(fw.ConfigError, match="async factory"):
        Fallback(factory=backup).call(raises(ConnectionError()))


def test_selected_by_exception_type(shell: Shell) -> None:
    fallback = Fallback(value="stale", on=ConnectionError)
    assert shell.run(fallback, raises(ConnectionError())) == "stale"
    with pytest.raises(KeyError):
        shell.run(fallback, raises(KeyError()))


def test_selected_by_rejection_kind(shell: Shell) -> None:
    fallback = Fallback(value="degraded", kinds={"circuit_open", "timeout"})
    assert shell.run(fallback, raises(CircuitOpenError("b", CircuitState.OPEN, 1.0))) == "degraded"
    assert shell.run(fallback, raises(TimeoutExceeded("t", 1.0))) == "degraded"
    with pytest.raises(fw.BulkheadFullError):
        shell.run(fallback, raises(fw.BulkheadFullError("bh", "full")))
    with pytest.raises(ValueError, match="not handled"):
        shell.run(fallback, raises(ValueError("not handled")))


def test_type_or_kind(shell: Shell) -> None:
    fallback = Fallback(value=0, on=ValueError, kinds={"timeout"})
    assert shell.run(fallback, raises(ValueError())) == 0
    assert shell.run(fallback, raises(TimeoutExceeded("t", 1.0))) == 0


def test_failed_results_are_replaced(shell: Shell) -> None:
    seen: list[BaseException] = []

    def factory(exc: BaseException) -> int:
        seen.append(exc)
        return 200

    fallback = Fallback(factory=factory, failure_result=lambda status: status >= 500)
    assert shell.run(fallback, lambda: 503) == 200
    assert shell.run(fallback, lambda: 404) == 404
    assert isinstance(seen[0], fw.FailedResult)
    assert seen[0].result == 503


def test_cancellation_is_never_swallowed() -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Fallback(value=None).call_async(cancelled))


def test_the_call_context_records_the_degradation(shell: Shell) -> None:
    events: list[fw.Event] = []
    fallback = Fallback(value="x", name="gifts-static", listeners=[events.append])
    with fw.call_context() as context:
        shell.run(fallback, lambda: "fresh")
        assert not context.degraded
        shell.run(fallback, raises(TimeoutExceeded("t", 1.0)))
    assert context.degraded
    assert (context.degraded_by, context.degraded_reason) == ("gifts-static", "timeout")
    assert events[0].kind == "fallback"
    assert fw.current_call() is None


def test_exactly_one_of_value_or_factory() -> None:
    with pytest.raises(fw.ConfigError, match="neither"):
        Fallback()  # type: ignore[call-overload]  # what a type checker refuses too
    with pytest.raises(fw.ConfigError, match="both"):
        Fallback(1, factory=lambda e: 2)  # type: ignore[call-overload]
    with pytest.raises(fw.ConfigError, match="kinds must be a collection of kinds"):
        Fallback(1, kinds="timeout")
