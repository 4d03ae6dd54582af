"""Circuit breakers and timeouts: floodwall beside pybreaker, circuitbreaker, aiobreaker,
purgatory and hyx.

Every protected function is the cheapest possible (``return 1``, or ``raise ValueError("x")``),
so the figures are the cost each library adds to a call. Peers are applied exactly as their
documentation shows (``@breaker`` and friends); untyped decorators are applied as plain calls
(``breaker(f)``), which is what the ``@`` syntax does, so the type checker stays strict.

A peer that is not installed or fails to set up becomes a skipped row with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Awaitable, Callable
from itertools import repeat
from typing import ParamSpec, TypeVar

import floodwall
from _harness import Case, Target

P = ParamSpec("P")
R = TypeVar("R")

SYNC = "breaker success path, sync"
ASYNC = "breaker success path, async"
OPEN = "rejection while OPEN"
TIMEOUT = "async timeout"

# Labels that targets refer to.
PLAIN_CALL = "plain call f()"
FW_SYNC = "floodwall @CircuitBreaker"
PYBREAKER_SYNC = "pybreaker @CircuitBreaker()"
CIRCUITBREAKER_SYNC = "circuitbreaker @circuit"
PLAIN_AWAIT = "plain await f()"
FW_ASYNC = "floodwall @CircuitBreaker (async def)"
AIOBREAKER_ASYNC = "aiobreaker @CircuitBreaker()"
CIRCUITBREAKER_ASYNC = "circuitbreaker @circuit (async def)"
BARE_RAISE = "bare raise-and-catch, one frame"
CALLEE_RAISE = "call g() that raises, catch"
FW_OPEN = "floodwall @CircuitBreaker, tripped OPEN"
ASYNCIO_TIMEOUT = "async with asyncio.timeout(1.0)"
FW_TIMEOUT_CALL = "floodwall await timeout.call_async(f)"
FW_TIMEOUT_DECO = "floodwall @Timeout(1.0)"

LONG = 3600.0
"""Open durations long enough that a tripped breaker stays open for the whole run."""


def f() -> int:
    return 1


async def af() -> int:
    return 1


def g() -> int:
    raise ValueError("x")


def deco(fn: Callable[P, R]) -> Callable[P, R]:
    """The cheapest decorator there is: one extra Python frame."""

    def w(*a: P.args, **k: P.kwargs) -> R:
        return fn(*a, **k)

    return w


def adeco(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The async twin of :func:`deco`: one extra coroutine."""

    async def w(*a: P.args, **k: P.kwargs) -> R:
        return await fn(*a, **k)

    return w


def _peer(group: str, label: str, build: Callable[[str, str], Case]) -> Case:
    """``build(group, label)``, or a skipped row saying why it could not be set up."""
    try:
        return build(group, label)
    except Exception as exc:
        return Case(group, label, skip=f"could not be set up: {type(exc).__name__}: {exc}")


def _trip(fn: Callable[[], object], *expected: type[BaseException], calls: int = 25) -> None:
    """Call a failing ``fn`` until its breaker is open (errors of the listed types expected)."""
    for _ in range(calls):
        with contextlib.suppress(*expected):
            fn()


# -- 1. success path, sync ---------------------------------------------------------------------


def _pybreaker_sync(group: str, label: str) -> Case:
    import pybreaker

    return Case(group, label, fn=pybreaker.CircuitBreaker(name="bench")(f), ref="pybreaker")


def _circuitbreaker_sync(group: str, label: str) -> Case:
    import circuitbreaker

    return Case(
        group,
        label,
        fn=circuitbreaker.circuit(name="bench-sync")(f),
        ref="circuitbreaker",
        note="`circuit(...)` returns a `circuitbreaker.CircuitBreaker`, so `@circuit` and "
        "`@CircuitBreaker()` are the same code path. It counts consecutive failures only: no "
        "clock read, no window, no latency figures; floodwall times every call (two clock "
        "reads and a histogram bin, ~100 ns) for slow-call detection and p50/p99.",
    )


def _purgatory_sync(group: str, label: str) -> Case:
    import purgatory

    factory = purgatory.SyncCircuitBreakerFactory()
    return Case(
        group,
        label,
        fn=factory("bench-sync")(f),
        note="purgatory looks the breaker up by name in its unit of work and builds a "
        "`SyncCircuitBreaker` on every call.",
    )


def _sync_cases() -> list[Case]:
    breaker = floodwall.CircuitBreaker("bench-sync")
    other = floodwall.CircuitBreaker("bench-sync-call")

    def explicit(n: int) -> None:
        for _ in repeat(None, n):
            other.call(f)

    return [
        Case(SYNC, PLAIN_CALL, fn=f, ref="plain"),
        Case(SYNC, "trivial decorator", fn=deco(f)),
        Case(SYNC, FW_SYNC, fn=breaker(f)),
        Case(SYNC, "floodwall breaker.call(f)", loop=explicit),
        _peer(SYNC, PYBREAKER_SYNC, _pybreaker_sync),
        _peer(SYNC, CIRCUITBREAKER_SYNC, _circuitbreaker_sync),
        _peer(SYNC, "purgatory @SyncCircuitBreakerFactory()(name)", _purgatory_sync),
        Case(
            SYNC, "hyx", skip="hyx 0.0.2 has no sync API (its breaker decorates coroutines only)."
        ),
    ]


# -- 2. success path, async --------------------------------------------------------------------


def _aiobreaker_async(group: str, label: str) -> Case:
    import aiobreaker

    return Case(group, label, afn=aiobreaker.CircuitBreaker(name="bench")(af), ref="aiobreaker")


def _purgatory_async(group: str, label: str) -> Case:
    import purgatory

    factory = purgatory.AsyncCircuitBreakerFactory()
    return Case(
        group,
        label,
        afn=factory("bench-async")(af),
        note="looks the breaker up in its unit of work (`async with uow`) on every call.",
    )


def _hyx_async(group: str, label: str) -> Case:
    from hyx.circuitbreaker import consecutive_breaker

    return Case(
        group,
        label,
        afn=consecutive_breaker()(af),
        note="hyx 0.0.2 has one breaker, `consecutive_breaker` (consecutive failures, no window).",
    )


def _circuitbreaker_async(group: str, label: str) -> Case:
    import circuitbreaker

    return Case(
        group, label, afn=circuitbreaker.circuit(name="bench-async")(af), ref="circuitbreaker"
    )


def _pybreaker_async(group: str, label: str) -> Case:
    import pybreaker

    breaker = pybreaker.CircuitBreaker(name="bench-async")
    try:
        breaker.call_async(af)  # type: ignore[no-untyped-call]
    except Exception as exc:
        return Case(
            group,
            label,
            skip=f"`call_async` is a Tornado coroutine; without tornado it raises "
            f"`{type(exc).__name__}: {exc}`. Decorating an `async def` with `@breaker` runs but "
            "protects nothing: the breaker calls the function, gets a coroutine object back and "
            "counts a success; exceptions raised when it is awaited never reach the breaker.",
        )

    async def call() -> object:
        return await breaker.call_async(af)  # type: ignore[no-untyped-call]

    return Case(group, label, afn=call, note="Tornado coroutine via `call_async`.")


def _async_cases() -> list[Case]:
    breaker = floodwall.CircuitBreaker("bench-async")
    other = floodwall.CircuitBreaker("bench-async-call")

    async def explicit(n: int) -> None:
        for _ in repeat(None, n):
            await other.call_async(af)

    return [
        Case(ASYNC, PLAIN_AWAIT, afn=af, ref="plain"),
        Case(ASYNC, "trivial async decorator", afn=adeco(af)),
        Case(ASYNC, FW_ASYNC, afn=breaker(af)),
        Case(ASYNC, "floodwall await breaker.call_async(f)", aloop=explicit),
        _peer(ASYNC, AIOBREAKER_ASYNC, _aiobreaker_async),
        _peer(ASYNC, CIRCUITBREAKER_ASYNC, _circuitbreaker_async),
        _peer(ASYNC, "purgatory @AsyncCircuitBreakerFactory()(name)", _purgatory_async),
        _peer(ASYNC, "hyx @consecutive_breaker()", _hyx_async),
        _peer(ASYNC, "pybreaker call_async", _pybreaker_async),
    ]


# -- 3. rejection while OPEN -------------------------------------------------------------------


def bare_raise(n: int) -> None:
    for _ in repeat(None, n):
        try:
            raise ValueError("x")
        except ValueError:
            pass


def _pybreaker_open(group: str, label: str) -> Case:
    import pybreaker

    fn = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=LONG, name="bench-open")(g)
    _trip(fn, ValueError, pybreaker.CircuitBreakerError)
    return Case(group, label, fn=fn, raises=pybreaker.CircuitBreakerError)


def _circuitbreaker_open(group: str, label: str) -> Case:
    import circuitbreaker

    fn = circuitbreaker.circuit(failure_threshold=1, recovery_timeout=LONG, name="bench-open")(g)
    _trip(fn, ValueError, circuitbreaker.CircuitBreakerError)
    return Case(group, label, fn=fn, raises=circuitbreaker.CircuitBreakerError)


def _aiobreaker_open(group: str, label: str) -> Case:
    import aiobreaker

    fn = aiobreaker.CircuitBreaker(fail_max=1, timeout_duration=datetime.timedelta(seconds=LONG))(g)
    _trip(fn, ValueError, aiobreaker.CircuitBreakerError)
    return Case(
        group,
        label,
        fn=fn,
        raises=aiobreaker.CircuitBreakerError,
        note="aiobreaker's sync path (`@breaker` on a plain function).",
    )


def _purgatory_open(group: str, label: str) -> Case:
    import purgatory
    from purgatory.domain.model import OpenedState

    factory = purgatory.SyncCircuitBreakerFactory(default_threshold=1, default_ttl=LONG)
    fn = factory("bench-open")(g)
    _trip(fn, ValueError, OpenedState)
    try:
        fn()
    except OpenedState as exc:
        opened = exc
    else:
        raise AssertionError("purgatory breaker did not open")

    def forget_traceback() -> None:
        opened.__traceback__ = None

    return Case(
        group,
        label,
        fn=fn,
        raises=OpenedState,
        before=forget_traceback,
        note="purgatory raises the *same* `OpenedState` instance on every rejection, so each "
        "raise prepends to that exception's traceback: it grows by 6 entries per rejected call "
        "and keeps every frame alive (unbounded memory while the circuit stays open). The "
        "harness drops that traceback before each sample.",
    )


def _open_cases() -> list[Case]:
    tripped = floodwall.CircuitBreaker("bench-open", open_duration=LONG, max_open_duration=LONG)
    fw_open = tripped(g)
    _trip(fw_open, ValueError, floodwall.CircuitOpenError)
    if tripped.state is not floodwall.CircuitState.OPEN:
        raise RuntimeError(f"floodwall breaker did not trip: {tripped.state!r}")
    forced = floodwall.CircuitBreaker("bench-forced")
    forced.force_open()
    return [
        Case(OPEN, BARE_RAISE, loop=bare_raise, ref="bare raise"),
        Case(OPEN, CALLEE_RAISE, fn=g, raises=ValueError, ref="raise in callee"),
        Case(
            OPEN,
            "trivial decorator around g() that raises",
            fn=deco(g),
            raises=ValueError,
            note="what the thinnest Python decorator costs before deciding anything",
        ),
        Case(OPEN, FW_OPEN, fn=fw_open, raises=floodwall.CircuitOpenError),
        Case(
            OPEN,
            "floodwall @CircuitBreaker, force_open()",
            fn=forced(g),
            raises=floodwall.CircuitOpenError,
        ),
        _peer(OPEN, "pybreaker @CircuitBreaker(fail_max=1), open", _pybreaker_open),
        _peer(OPEN, "circuitbreaker @circuit(failure_threshold=1), open", _circuitbreaker_open),
        _peer(OPEN, "aiobreaker @CircuitBreaker(fail_max=1), open", _aiobreaker_open),
        _peer(OPEN, "purgatory @factory(name), threshold 1, open", _purgatory_open),
    ]


# -- 4. async timeout --------------------------------------------------------------------------


async def asyncio_timeout(n: int) -> None:
    for _ in repeat(None, n):
        async with asyncio.timeout(1.0):
            await af()


async def asyncio_wait_for(n: int) -> None:
    for _ in repeat(None, n):
        await asyncio.wait_for(af(), 1.0)


def _hyx_timeout_decorator(group: str, label: str) -> Case:
    from hyx.timeout import timeout

    # Applying hyx's decorator captures the running event loop: apply it once per loop, inside.
    decorated: dict[asyncio.AbstractEventLoop, Callable[[], Awaitable[object]]] = {}

    async def run(n: int) -> None:
        loop = asyncio.get_running_loop()
        fn = decorated.get(loop) or decorated.setdefault(loop, timeout(1.0)(af))
        for _ in repeat(None, n):
            await fn()

    return Case(
        group,
        label,
        aloop=run,
        note="runs the call in a new task under `asyncio.wait_for`; applying the decorator needs "
        "a running event loop (it captures it).",
    )


def _hyx_timeout_block(group: str, label: str) -> Case:
    from hyx.timeout import timeout

    async def run(n: int) -> None:
        for _ in repeat(None, n):
            async with timeout(1.0):
                await af()

    return Case(group, label, aloop=run)


def _timeout_cases() -> list[Case]:
    timeout = floodwall.Timeout(1.0)

    async def explicit(n: int) -> None:
        for _ in repeat(None, n):
            await timeout.call_async(af)

    return [
        Case(TIMEOUT, PLAIN_AWAIT, afn=af, ref="plain await"),
        Case(TIMEOUT, ASYNCIO_TIMEOUT, aloop=asyncio_timeout, ref="asyncio.timeout"),
        Case(TIMEOUT, "await asyncio.wait_for(f(), 1.0)", aloop=asyncio_wait_for),
        Case(
            TIMEOUT,
            FW_TIMEOUT_CALL,
            aloop=explicit,
            note="one `floodwall.Timeout(1.0)` built up front, as a policy object is meant to be.",
        ),
        Case(TIMEOUT, FW_TIMEOUT_DECO, afn=floodwall.Timeout(1.0)(af)),
        _peer(TIMEOUT, "hyx @timeout(1.0)", _hyx_timeout_decorator),
        _peer(TIMEOUT, "hyx async with timeout(1.0)", _hyx_timeout_block),
    ]


# -- the module's interface --------------------------------------------------------------------


def cases() -> list[Case]:
    return [*_sync_cases(), *_async_cases(), *_open_cases(), *_timeout_cases()]


def targets() -> list[Target]:
    return [
        Target(OPEN, FW_OPEN, BARE_RAISE, 2.0, "rejection while OPEN ≤ 2 × a bare raise-and-catch"),
        Target(
            TIMEOUT,
            FW_TIMEOUT_CALL,
            ASYNCIO_TIMEOUT,
            0.5,
            "async timeout, `Timeout.call_async` ≤ 0.5 × `asyncio.timeout`",
        ),
        Target(
            TIMEOUT,
            FW_TIMEOUT_DECO,
            ASYNCIO_TIMEOUT,
            0.5,
            "async timeout, `@Timeout` ≤ 0.5 × `asyncio.timeout`",
        ),
        Target(
            OPEN,
            FW_OPEN,
            CALLEE_RAISE,
            2.0,
            "rejection while OPEN ≤ 2 × raise-and-catch across one call (any decorator's floor)",
        ),
        Target(
            OPEN,
            FW_OPEN,
            "trivial decorator around g() that raises",
            None,
            "rejection while OPEN vs the thinnest Python decorator re-raising",
        ),
        Target(SYNC, FW_SYNC, PYBREAKER_SYNC, 0.5, "sync success path ≤ 0.5 × pybreaker"),
        Target(SYNC, FW_SYNC, CIRCUITBREAKER_SYNC, 1.0, "sync success path ≤ circuitbreaker"),
        Target(ASYNC, FW_ASYNC, AIOBREAKER_ASYNC, 0.5, "async success path ≤ 0.5 × aiobreaker"),
        Target(ASYNC, FW_ASYNC, CIRCUITBREAKER_ASYNC, 1.0, "async success path ≤ circuitbreaker"),
    ]
