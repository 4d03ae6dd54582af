"""Checked by mypy (not run by pytest): decorators keep the wrapped signature."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, assert_type

import floodwall as fw

breaker = fw.CircuitBreaker()
timeout = fw.Timeout(1.0)
pipeline = fw.Pipeline(fw.Fallback(value=0), breaker, timeout)


@breaker
def get(path: str, retries: int = 0) -> bytes:
    return path.encode()


@pipeline
async def aget(path: str) -> int:
    return len(path)


assert_type(get("/x"), bytes)
assert_type(get("/x", retries=2), bytes)
assert_type(breaker.call(get, "/y"), bytes)


async def use() -> None:
    pending: Coroutine[Any, Any, int] = aget("/x")  # a decorated coroutine function stays one
    await pending
    assert_type(await aget("/x"), int)
    assert_type(await timeout.call_async(aget, "/z"), int)
