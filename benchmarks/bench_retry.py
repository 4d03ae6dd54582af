"""Retries: what a retry policy costs while nothing fails, floodwall beside tenacity, stamina and
backoff.

The issue's target: ``@Retry`` costs at most 0.05 × tenacity's decorator on the success path, i.e.
nothing noticeable until something fails. Every protected function is the cheapest possible
(``return 1``), so a figure is the cost each library adds to a call. Each policy is configured
as its documentation shows for a typical network call (3 attempts, exponential backoff with
jitter); the backoff does not matter on the success path, but a budget does: the floodwall rows
include the default private retry budget (one lock-free request count per call) unless the label
says otherwise.

A third group measures one failure then a success, without waits (``NoBackoff`` and peers'
equivalents, no budget), i.e. the cost of the retry machinery itself.

A peer that is not installed or fails to set up becomes a skipped row with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

import floodwall
from _harness import Case, Target
from floodwall.backoff import NoBackoff

SYNC = "retry success path, sync"
ASYNC = "retry success path, async"
AGAIN = "retry once: one failure, then success (no wait), sync"

PLAIN_CALL = "plain call f()"
PLAIN_AWAIT = "plain await f()"
FW_SYNC = "floodwall @Retry()"
FW_ASYNC = "floodwall @Retry() (async def)"
TENACITY_SYNC = "tenacity @retry(stop, wait)"
TENACITY_ASYNC = "tenacity @retry(stop, wait) (async def)"
STAMINA_SYNC = "stamina @retry(on, attempts)"
STAMINA_ASYNC = "stamina @retry(on, attempts) (async def)"
BACKOFF_SYNC = "backoff @on_exception(expo)"
BACKOFF_ASYNC = "backoff @on_exception(expo) (async def)"
FW_AGAIN = "floodwall @Retry(NoBackoff, budget=None)"
TENACITY_AGAIN = "tenacity @retry(stop)"


def f() -> int:
    return 1


async def af() -> int:
    return 1


def _peer(group: str, label: str, build: Callable[[str, str], Case]) -> Case:
    """``build(group, label)``, or a skipped row saying why it could not be set up."""
    try:
        return build(group, label)
    except Exception as exc:
        return Case(group, label, skip=f"could not be set up: {type(exc).__name__}: {exc}")


# -- peers --------------------------------------------------------------------------------------


def _tenacity(fn: Callable[..., Any]) -> Callable[..., Any]:
    import tenacity

    return tenacity.retry(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_random_exponential(multiplier=0.1, max=10),
        reraise=True,
    )(fn)


def _stamina(fn: Callable[..., Any]) -> Callable[..., Any]:
    import stamina

    return stamina.retry(on=ConnectionError, attempts=3, wait_initial=0.1, wait_max=10)(fn)


def _backoff(fn: Callable[..., Any]) -> Callable[..., Any]:
    import backoff

    decorated: Callable[..., Any] = backoff.on_exception(
        backoff.expo, ConnectionError, max_tries=3, factor=0.1, max_value=10
    )(fn)
    return decorated


def _wrap(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]], fn: Callable[..., Any], **kw: Any
) -> Callable[[str, str], Case]:
    def build(group: str, label: str) -> Case:
        decorated = wrap(fn)
        if group == ASYNC:
            return Case(group, label, afn=decorated, **kw)
        return Case(group, label, fn=decorated, **kw)

    return build


# -- 1. success path, sync ------------------------------------------------------------------


def _sync_cases() -> list[Case]:
    policy = floodwall.Retry("bench-sync")
    explicit_policy = floodwall.Retry("bench-sync-call")
    shared = floodwall.RetryBudget()
    shared_policy = floodwall.Retry("bench-sync-shared", budget=shared)
    floodwall.Retry("another-user-of-the-budget", budget=shared)

    def explicit(n: int) -> None:
        for _ in repeat(None, n):
            explicit_policy.call(f)

    return [
        Case(SYNC, PLAIN_CALL, fn=f, ref="plain"),
        Case(SYNC, FW_SYNC, fn=policy(f)),
        Case(SYNC, "floodwall retry.call(f)", loop=explicit),
        Case(SYNC, "floodwall @Retry(budget=None)", fn=floodwall.Retry(budget=None)(f)),
        Case(
            SYNC,
            "floodwall @Retry(budget=shared)",
            fn=shared_policy(f),
            note="a budget shared by several policies marks the context (one context variable "
            "set and reset per call), so nested policies count a request once.",
        ),
        _peer(SYNC, TENACITY_SYNC, _wrap(_tenacity, f, ref="tenacity")),
        _peer(SYNC, STAMINA_SYNC, _wrap(_stamina, f, ref="stamina")),
        _peer(SYNC, BACKOFF_SYNC, _wrap(_backoff, f, ref="backoff")),
    ]


# -- 2. success path, async -----------------------------------------------------------------


def _async_cases() -> list[Case]:
    policy = floodwall.Retry("bench-async")
    explicit_policy = floodwall.Retry("bench-async-call")

    async def explicit(n: int) -> None:
        for _ in repeat(None, n):
            await explicit_policy.call_async(af)

    return [
        Case(ASYNC, PLAIN_AWAIT, afn=af, ref="plain"),
        Case(ASYNC, FW_ASYNC, afn=policy(af)),
        Case(ASYNC, "floodwall await retry.call_async(f)", aloop=explicit),
        _peer(ASYNC, TENACITY_ASYNC, _wrap(_tenacity, af, ref="tenacity")),
        _peer(ASYNC, STAMINA_ASYNC, _wrap(_stamina, af, ref="stamina")),
        _peer(ASYNC, BACKOFF_ASYNC, _wrap(_backoff, af, ref="backoff")),
    ]


# -- 3. one failure, then success -----------------------------------------------------------


def _blip() -> Callable[[], int]:
    """A function that fails every other call with a ConnectionError: each measured call
    retries once."""
    state = [False]

    def blip() -> int:
        state[0] = not state[0]
        if state[0]:
            raise ConnectionError("blip")
        return 1

    return blip


def _tenacity_again(group: str, label: str) -> Case:
    import tenacity

    return Case(
        group,
        label,
        fn=tenacity.retry(stop=tenacity.stop_after_attempt(3), reraise=True)(_blip()),
        ref="tenacity",
        note="the peers call `time.sleep(0)` between attempts even with no wait (a system call "
        "that yields the CPU); floodwall skips a zero wait, which is most of the gap.",
    )


def _stamina_again(group: str, label: str) -> Case:
    import stamina

    stamina.instrumentation.set_on_retry_hooks([])  # no log line per retry
    retry = stamina.retry(on=ConnectionError, attempts=3, wait_initial=0, wait_jitter=0, wait_max=0)
    return Case(group, label, fn=retry(_blip()))


def _backoff_again(group: str, label: str) -> Case:
    import backoff

    retry = backoff.on_exception(
        backoff.constant, ConnectionError, max_tries=3, interval=0, jitter=None
    )
    return Case(group, label, fn=retry(_blip()))


def _again_cases() -> list[Case]:
    fw_policy = floodwall.Retry("bench-again", backoff=NoBackoff(), budget=None)
    return [
        Case(AGAIN, FW_AGAIN, fn=fw_policy(_blip())),
        _peer(AGAIN, TENACITY_AGAIN, _tenacity_again),
        _peer(AGAIN, "stamina @retry(wait_initial=0, wait_jitter=0)", _stamina_again),
        _peer(AGAIN, "backoff @on_exception(constant, interval=0)", _backoff_again),
    ]


def cases() -> list[Case]:
    return [*_sync_cases(), *_async_cases(), *_again_cases()]


def targets() -> list[Target]:
    return [
        Target(SYNC, FW_SYNC, TENACITY_SYNC, 0.05, "sync success path ≤ 0.05 × tenacity"),
        Target(ASYNC, FW_ASYNC, TENACITY_ASYNC, 0.05, "async success path ≤ 0.05 × tenacity"),
        Target(SYNC, FW_SYNC, STAMINA_SYNC, None, "sync success path vs stamina"),
        Target(ASYNC, FW_ASYNC, STAMINA_ASYNC, None, "async success path vs stamina"),
        Target(SYNC, FW_SYNC, BACKOFF_SYNC, None, "sync success path vs backoff"),
        Target(ASYNC, FW_ASYNC, BACKOFF_ASYNC, None, "async success path vs backoff"),
        Target(AGAIN, FW_AGAIN, TENACITY_AGAIN, None, "one retry, no wait, vs tenacity"),
    ]
