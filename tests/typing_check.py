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


# A Fallback widens the answer's type by what it answers instead (R | T).
none_fallback = fw.Fallback(value=None)
zero_fallback = fw.Fallback(value=0)


def describe(exc: BaseException) -> str:
    return type(exc).__name__


text_fallback = fw.Fallback(factory=describe)


async def backup(exc: BaseException) -> str:
    return "backup"


async_fallback = fw.Fallback(factory=backup)
assert_type(none_fallback, fw.Fallback[None])
assert_type(text_fallback, fw.Fallback[str])
assert_type(async_fallback, fw.Fallback[str])


@none_fallback
def lookup(path: str) -> bytes:
    return path.encode()


@none_fallback
async def alookup(path: str) -> bytes:
    return path.encode()


@async_fallback
async def aname(n: int) -> int:
    return n


assert_type(lookup("/x"), bytes | None)
assert_type(zero_fallback.call(get, "/y"), bytes | int)
assert_type(text_fallback.call(get, "/y", retries=1), bytes | str)
found = lookup("/x")
if found is not None:  # the None a caller must handle
    assert_type(found, bytes)


async def use_fallbacks() -> None:
    pending: Coroutine[Any, Any, bytes | None] = alookup("/x")
    assert_type(await pending, bytes | None)
    assert_type(await aname(1), int | str)
    assert_type(await none_fallback.call_async(alookup, "/z"), bytes | None)
    assert_type(await async_fallback.call_async(aget, "/z"), int | str)
    assert_type(await pipeline(aget)("/x"), int)  # a Pipeline keeps the wrapped type
