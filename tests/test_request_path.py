"""One request path: every policy runs through the two drivers, and both worlds agree.

The drivers (``floodwall._core.drivers``) are the only code that runs a policy around a call.
These tests hold every policy class to that (none writes its own ``call``/``call_async``) and
run each through the same script of calls in both worlds, on a fake clock: the sequence of
outcomes a thread sees must be the sequence a task sees. Hedging is the one documented
exception (async only: a thread cannot be cancelled).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pkgutil
import random
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import floodwall as fw
from floodwall import adaptive, chaos, ratelimit
from floodwall._core.admission import Attempts, Flow, Gate, Scoped
from floodwall._core.policy import Policy
from floodwall.backoff import Fixed
from floodwall.config import Registry, Resource
from floodwall.degrade import FallbackSource, SampledDrop
from floodwall.degrade.levels import Levels
from floodwall.degrade.priority import PriorityGate
from floodwall.shared import (
    Cache,
    Frequency,
    GlobalLimiter,
    Idempotency,
    LeasedLimiter,
    TimeSliceLimiter,
)
from floodwall.stores import Store, connect
from floodwall.stores.host import HostStore

APPLICATIONS = ("floodwall.gateway", "floodwall.drill", "floodwall.sim", "floodwall.cli")
NEEDS_A_PROJECT = ("floodwall.django",)
"""Modules that import only inside a configured framework project (Django's settings); they
define no policy of their own: the middleware runs the inbound guard's (tests/test_django.py)."""
SHAPES = (Gate, Flow, Attempts, Scoped)


def _policy_classes() -> list[type[Policy]]:
    found: dict[str, type[Policy]] = {}
    for info in pkgutil.walk_packages(fw.__path__, "floodwall."):
        if info.name.startswith(APPLICATIONS + NEEDS_A_PROJECT) or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an integration whose client library is not installed
            continue
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, Policy)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


POLICY_CLASSES = _policy_classes()
PROTOCOL = {Policy, *SHAPES, fw.Pipeline}
"""The protocol itself: the base, the four shapes, and composition (which chains the stages)."""


@pytest.mark.parametrize("cls", [c for c in POLICY_CLASSES if c not in PROTOCOL], ids=repr)
def test_no_policy_writes_its_own_call_body(cls: type[Policy]) -> None:
    own = [name for name in ("call", "call_async") if name in cls.__dict__]
    assert own == [], f"{cls.__qualname__} defines {own}: it must run through the drivers"
    runnable = not getattr(cls.call, "__isabstractmethod__", False)  # a base of shaped classes
    assert issubclass(cls, (*SHAPES, fw.Pipeline)) or not runnable, (
        f"{cls.__qualname__} has no request shape"
    )


def test_the_walk_finds_the_policies() -> None:
    names = {cls.__name__ for cls in POLICY_CLASSES}
    assert {"CircuitBreaker", "Retry", "Timeout", "Bulkhead", "TokenBucket", "Cache"} <= names


# -- the same script in both worlds -----------------------------------------------------------

Factory = Callable[[fw.FakeClock], Policy]


def _levels_gate(clock: fw.FakeClock) -> Policy:
    levels = Levels(clock=clock)
    gate = levels.gate(2)
    levels.shed(2, ttl=0.75)
    return gate


_HOST_STORES: list[Store] = []


def _host_bulkhead(clock: fw.FakeClock) -> Policy:
    """A host-wide bulkhead on a real ``host://`` store of its own (closed after the module)."""
    store = connect(f"host://request-path-{os.getpid()}-{len(_HOST_STORES)}")
    assert isinstance(store, HostStore)
    _HOST_STORES.append(store)
    return fw.HostBulkhead("hb", store=store, max_concurrent=2, clock=clock)


@pytest.fixture(scope="module", autouse=True)
def _close_host_stores() -> Iterator[None]:
    yield
    while _HOST_STORES:
        _HOST_STORES.pop().close()


def _resource(clock: fw.FakeClock) -> Policy:
    document = {
        "resources": {
            "dep": {
                "circuit_breaker": {"minimum_calls": 4, "open_duration": "0.5s"},
                "fallback": {"value": -1},
            }
        }
    }
    return Registry(document, clock=clock).get("dep")


def _metered_resource(clock: fw.FakeClock) -> Policy:
    """A resource whose meter takes its breaker into its runner (no fallback outside it)."""
    document = {
        "resources": {
            "dep": {
                "circuit_breaker": {"minimum_calls": 4, "open_duration": "0.5s"},
                "bulkhead": {"max_concurrent": 2},
            }
        }
    }
    return Registry(document, clock=clock).get("dep")


def _metered_waiting_resource(clock: fw.FakeClock) -> Policy:
    """A resource whose meter takes in a gate that makes callers wait (a paced limiter)."""
    resource = Registry({"resources": {"dep": {}}}, clock=clock).get("dep")
    resource.use(
        (
            ratelimit.TokenBucket("6/s", max_wait=0.2, clock=clock),
            fw.CircuitBreaker("mb", minimum_calls=4, open_duration=0.5, clock=clock),
        )
    )
    return resource


def _answering(clock: fw.FakeClock) -> Policy:
    """What a resource runs when the dependency must not be called: its meter and fallback."""
    resource = _resource(clock)
    assert isinstance(resource, Resource)
    return resource.answering()


class _Ends:
    """A call observer that keeps what each call ended as."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, str]] = []

    def begin(self, resource: str) -> object:
        return len(self.ends)

    def end(self, resource: str, begun: object, **figures: Any) -> None:
        self.ends.append((figures["outcome"], figures["answer"]))


def _observed_resource(clock: fw.FakeClock) -> Policy:
    """A resource whose meter runs as the observers' gate (one observer installed)."""
    resource = _resource(clock)
    assert isinstance(resource, Resource)
    resource._registry.add_observer(_Ends())
    return resource


FACTORIES: dict[str, Factory] = {
    "CircuitBreaker": lambda c: fw.CircuitBreaker("b", minimum_calls=4, open_duration=0.5, clock=c),
    "Bulkhead": lambda c: fw.Bulkhead("h", max_concurrent=2, clock=c),
    "HostBulkhead": _host_bulkhead,
    "Timeout": lambda c: fw.Timeout(1.0, clock=c),
    "Fallback": lambda c: fw.Fallback(value=-1, clock=c),
    "Retry": lambda c: fw.Retry(
        "r", attempts=3, backoff=Fixed(0.05), budget=None, retry_on=ValueError, clock=c
    ),
    "FixedWindow": lambda c: ratelimit.FixedWindow("6/s", clock=c),
    "SlidingLog": lambda c: ratelimit.SlidingLog("6/s", clock=c),
    "SlidingWindowCounter": lambda c: ratelimit.SlidingWindowCounter("6/s", clock=c),
    "TokenBucket": lambda c: ratelimit.TokenBucket("6/s", burst=2, clock=c),
    "GCRA": lambda c: ratelimit.GCRA("6/s", burst=2, clock=c),
    "LeakyBucket": lambda c: ratelimit.LeakyBucket("6/s", queue=1, max_wait=0.0, clock=c),
    "WarmUp": lambda c: ratelimit.WarmUp("6/s", warmup=1.0, clock=c),
    "TokenBucket with max_wait": lambda c: ratelimit.TokenBucket("6/s", max_wait=0.2, clock=c),
    "Multi": lambda c: ratelimit.Multi(
        ratelimit.TokenBucket("8/s", clock=c), ratelimit.FixedWindow("20/2s", clock=c), clock=c
    ),
    "Keyed": lambda c: ratelimit.Keyed(
        ratelimit.TokenBucket("3/s", burst=1, clock=c), key=lambda i: i % 2
    ),
    "HotKeys": lambda c: ratelimit.HotKeys(
        ratelimit.Keyed(ratelimit.TokenBucket("3/s", burst=1, clock=c), key=lambda i: i % 3),
        {1: ratelimit.TokenBucket("1/s", clock=c)},
    ),
    "GlobalLimiter": lambda c: GlobalLimiter("fixed_window", "6/s", clock=c),
    "LeasedLimiter": lambda c: LeasedLimiter("fixed_window", "6/s", clock=c),
    "TimeSliceLimiter": lambda c: TimeSliceLimiter("6/s", clock=c),
    "Frequency": lambda c: Frequency(4, 1.0, clock=c),
    "AdaptiveLimiter": lambda c: adaptive.AdaptiveLimiter(adaptive.AIMDLimit(), clock=c),
    "LoadShedder": lambda c: adaptive.LoadShedder(
        adaptive.AdaptiveLimiter(adaptive.AIMDLimit(), clock=c), clock=c
    ),
    "ClientThrottle": lambda c: adaptive.ClientThrottle(clock=c),
    "ChaosException": lambda c: chaos.ChaosException(
        rate=0.3, allow=True, clock=c, rng=random.Random(3)
    ),
    "ChaosLatency": lambda c: chaos.ChaosLatency(
        0.02, rate=0.5, allow=True, clock=c, rng=random.Random(4)
    ),
    "ChaosResult": lambda c: chaos.ChaosResult(
        "injected", rate=0.3, allow=True, clock=c, rng=random.Random(5)
    ),
    "SampledDrop": lambda c: SampledDrop(0.3, rng=random.Random(6), clock=c),
    "LevelGate": _levels_gate,
    "PriorityGate": lambda c: PriorityGate(2, clock=c),
    "Cache": lambda c: Cache(ttl=0.25, clock=c),
    "FallbackSource": lambda c: FallbackSource(lambda i: -i, clock=c),
    "Idempotency": lambda c: Idempotency(key=lambda i: f"k{i % 4}", clock=c),
    "Resource": _resource,
    "_Answering (a resource's answering policies)": _answering,
    "_Observed (a resource observed per call)": _observed_resource,
    "Resource (metered breaker)": _metered_resource,
    "Resource (metered waiting limiter)": _metered_waiting_resource,
    "Pipeline (a run of gates that waits)": lambda c: fw.Pipeline(
        ratelimit.TokenBucket("6/s", max_wait=0.2, clock=c),
        fw.CircuitBreaker("wb", minimum_calls=4, open_duration=0.5, clock=c),
        fw.Bulkhead("wbh", max_concurrent=2, clock=c),
    ),
    "Pipeline": lambda c: fw.Pipeline(
        fw.Fallback(value=-1, clock=c),
        fw.CircuitBreaker("pb", minimum_calls=4, open_duration=0.5, clock=c),
        fw.Bulkhead("pbh", max_concurrent=2, clock=c),
        fw.Retry("pr", attempts=2, backoff=Fixed(0.05), budget=None, retry_on=ValueError, clock=c),
        fw.Timeout(1.0, clock=c),
    ),
}

CALLS = 24
STEP = 0.1


def _fails(i: int) -> bool:
    return i % 3 == 1 or 9 <= i <= 13  # scattered failures, then a run that trips breakers


def _outcome(run: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("answer", run())
    except Exception as exc:
        return ("error", type(exc).__name__, getattr(exc, "kind", None))


def _sync_trace(policy: Policy, clock: fw.FakeClock) -> list[tuple[Any, ...]]:
    def dependency(i: int) -> int:
        if _fails(i):
            raise ValueError(f"boom {i}")
        return i * 2

    trace = []
    for i in range(CALLS):
        trace.append(_outcome(lambda i=i: policy.call(dependency, i)))  # type: ignore[misc]
        clock.advance(STEP)
    return trace


def _async_trace(policy: Policy, clock: fw.FakeClock) -> list[tuple[Any, ...]]:
    async def dependency(i: int) -> int:
        await asyncio.sleep(0)
        if _fails(i):
            raise ValueError(f"boom {i}")
        return i * 2

    async def one(i: int) -> tuple[Any, ...]:
        try:
            return ("answer", await _jumping(policy.call_async(dependency, i), clock))
        except Exception as exc:
            return ("error", type(exc).__name__, getattr(exc, "kind", None))

    async def script() -> list[tuple[Any, ...]]:
        trace = []
        for i in range(CALLS):
            trace.append(await one(i))
            clock.advance(STEP)
        return trace

    return asyncio.run(script())


async def _jumping(coroutine: Coroutine[Any, Any, Any], clock: fw.FakeClock) -> Any:
    """Await ``coroutine``, moving the fake clock to each sleeper's wake-up time (as a thread's
    ``clock.sleep`` does by itself), so both worlds see the same times."""
    task = asyncio.ensure_future(coroutine)
    for _ in range(1_000):
        for _ in range(20):  # let the call run as far as it can without time passing
            if task.done():
                return await task
            await asyncio.sleep(0)
        sleepers = clock._sleepers
        if sleepers:
            clock.advance(max(0.0, sleepers[0][0] - clock.monotonic()))
    return await task


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_both_worlds_give_the_same_outcomes(name: str) -> None:
    factory = FACTORIES[name]
    sync_clock, async_clock = fw.FakeClock(100.0), fw.FakeClock(100.0)
    sync = _sync_trace(factory(sync_clock), sync_clock)
    async_ = _async_trace(factory(async_clock), async_clock)
    assert sync == async_
    answers = [step for step in sync if step[0] == "answer"]
    assert answers, f"{name} answered none of {CALLS} calls"
    assert sync_clock.monotonic() == async_clock.monotonic()


def test_every_policy_class_has_a_script() -> None:
    """Adding a policy means adding it to the script above (or saying why not here)."""
    exempt = {
        "Hedge": "async only, tested below",
        "ThreadPoolBulkhead": "sync only (it runs callables on threads), tested below",
        "ChaosHang": "hangs by design; its latency path is ChaosLatency's",
        "ChaosPolicy": "the chaos base class; its faults are scripted",
        "RateLimiter": "abstract; its algorithms are scripted",
        "BBRLimiter": "reads the host's CPU; scripted in tests/test_adaptive_bbr.py",
        "_LevelView": "a priority gate's per-level view, run inside PriorityGate",
    }
    scripted = {name.split(" ")[0] for name in FACTORIES}
    names = {cls.__name__ for cls in POLICY_CLASSES if cls not in PROTOCOL}
    assert names - scripted - set(exempt) == set()


def test_hedge_runs_only_in_a_task() -> None:
    clock = fw.FakeClock()
    hedge = fw.Hedge(0.5, budget=None, clock=clock)
    with pytest.raises(fw.ConfigError, match="async calls only"):
        hedge.call(lambda: 1)

    async def answer() -> int:
        return 7

    assert asyncio.run(hedge.call_async(answer)) == 7


def test_thread_pool_bulkhead_runs_only_in_a_thread() -> None:
    with fw.ThreadPoolBulkhead("p", max_workers=2) as pool:
        assert pool.call(lambda: 7) == 7

        async def answer() -> int:
            return 7

        with pytest.raises(TypeError, match="runs sync callables on threads"):
            asyncio.run(pool.call_async(answer))
