"""The drivers' and the core's shortcuts, each measured alone: the path with it and without it.

STYLE.md item 23: a hot-path trick stays only where a case measures it on its own and it saves
at least a tenth of that path. Each group here times one path twice, the shortcut on and off
(off: a subclass or a stand-in that takes the plain road), side by side in the same rounds. The
protected function is ``return 1``.

* **gate lane**: a CLOSED breaker's open lane (:attr:`floodwall._core.admission.Gate.lane`)
  lets the drivers skip ``admit`` and count a fast success without ``record``; off, the drivers
  see no lane and every call runs both hooks (``record`` still counting lock-free).
* **tally**: ``next(tally.counter)`` against ``tally.add()`` (the bound ``__next__``), the bump
  of the breaker window's and the meter's success counts.
* **meter folded into its runner**: a config resource's meter takes its outermost gate (the
  breaker) into :func:`~floodwall._core.drivers.metered_sync` and shares its clock readings;
  off, the breaker reads another clock, so the meter runs alone around a runner of its own.
* **timeout box, common case**: two shortcuts of a timeout's call, each measured against the
  real call without it (the other one kept): its watch entry is also the deadline the call
  sees (one object per call; off, a separate :class:`~floodwall.context.Deadline`), and with no
  ambient deadline the budget and the watch are taken inline (off, through
  ``Timeout._budget`` and ``Watchdogs.enter``). Measured against a call without the *other*
  shortcut, the inline one saved 2 % only: the two pay off together.
* **fused async stages**: a config resource with a breaker, a bulkhead, a retry and a timeout
  (metrics on) runs its async stages in one coroutine
  (:func:`~floodwall._core.drivers.fused_async`), called through the stage the pipeline binds
  on itself (``resource.call_async``, as the outbound integrations and the gateway call it);
  off, the same runners nested (a coroutine and a ``partial`` per stage), and, between the two,
  fused but called through the class's ``call_async`` (a decorated function's road).
* **fixed window inline on memory://**: ``Frequency(limit=5, per=3600).allow(key)`` on
  ``memory://``, a key the store no longer holds on every call (150 000 keys in turn past the
  default bound of 100 000: each call opens a window and evicts, the usual call of
  ``benchmarks/million_keys.py``); the fixed-window op decides the one request it has parsed
  inline (``FixedWindowOp.step_one``); off, the arguments arrive as a list and the op takes the
  generic road (a state object, the step's ``decide`` and ``figures``, ``save``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from itertools import cycle, islice, repeat
from typing import Any

import floodwall
from _harness import Case, Target
from floodwall._core import drivers, timebox
from floodwall._core.clock import SystemClock
from floodwall._core.tally import Tally
from floodwall.backoff import FullJitter
from floodwall.config import Registry
from floodwall.context import _DEADLINE, Deadline

LANE = "gate lane: breaker success path, sync"
ALANE = "gate lane: breaker success path, async"
TALLY = "tally: one bump"
METER = "meter folded into its runner, sync"
AMETER = "meter folded into its runner, async"
ENTRY = "timeout box, common case"
FUSED = "fused async stages: breaker, bulkhead, retry, timeout"
WINDOW = "fixed window inline on memory://: Frequency.allow, a new key"

LANE_ON = "floodwall @CircuitBreaker, lane open"
LANE_OFF = "lane shut: admit + record"
TALLY_ON = "next(tally.counter)"
TALLY_OFF = "tally.add()"
METER_ON = "metrics on, meter takes in the breaker"
METER_OFF = "metrics on, meter alone (breaker on another clock)"
METER_NONE = "metrics off"
ENTRY_ON = "floodwall await timeout.call_async(f)"
ENTRY_OFF = "inline, but a Deadline of its own per call"
ENTRY_NONE = "neither shortcut: policy._budget, watchdogs.enter, own Deadline"
ENTRY_OUTLINE = "entry as deadline, but policy._budget and watchdogs.enter"
FUSED_ON = "floodwall await resource.call_async(af)"
FUSED_CLASS = "fused, through Pipeline.call_async"
FUSED_OFF = "nested runners"
WINDOW_ON = "floodwall Frequency.allow(key)"
WINDOW_OFF = "the op's generic step"


def f() -> int:
    return 1


async def af() -> int:
    return 1


class _ShutLane(floodwall.CircuitBreaker):
    """A breaker that shows the drivers no lane, so every call runs ``admit`` and ``record``;
    ``record`` still counts a fast success lock-free (as the breaker did before lanes)."""

    _own: Any = None

    def _set_lane(self) -> None:
        super()._set_lane()
        self._own, self.lane = self.lane, None

    def record(
        self, permit: int, now: float, duration: float, error: BaseException | None, result: Any
    ) -> None:
        own = self._own
        if error is None and own is not None and permit == own[0] and own[1](now, duration):
            return
        super().record(permit, now, duration, error, result)


class _OtherClock(SystemClock):
    """The system clock read through another function (equal time, unequal clock)."""

    monotonic = staticmethod(time.perf_counter)


class _Plain(timebox.Timebox):
    """The time box without its two shortcuts: the budget and the watch through the policy's
    and the watchdogs' methods, and a :class:`Deadline` of its own per call."""

    separate_deadline = True

    async def arun(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        policy = self.policy
        start = policy._now()
        budget, inherited = self._budget(start)
        task = asyncio.current_task()
        assert task is not None
        entry = timebox._Entry(start + budget, policy.clock, task, task.cancelling())
        watch = self._enter(entry, inherited, task)
        deadline = Deadline(start + budget, policy.clock) if self.separate_deadline else entry
        token = _DEADLINE.set(deadline)
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError as exc:
            if entry.state == timebox._EXPIRED and task.uncancel() <= entry.cancelling:
                raise policy._expired(budget, inherited) from exc
            raise
        finally:
            _DEADLINE.reset(token)
            if entry.state == timebox._PENDING:
                entry.state = timebox._DONE
            entry.task = None
            fifo = watch.fifo
            while fifo and fifo[0].state:
                fifo.popleft()
        if entry.state == timebox._EXPIRED:
            task.uncancel()
        return result

    def _budget(self, start: float) -> tuple[float, bool]:
        return self.policy._budget(start)

    def _enter(self, entry: Any, inherited: bool, task: asyncio.Task[Any]) -> Any:
        return self.policy._watchdogs.enter(entry, inherited)


class _Outline(_Plain):
    """The entry as the call's deadline (as the real time box), the budget and the watch through
    the policy's and the watchdogs' methods."""

    separate_deadline = False


class _EntryApart(_Plain):
    """The common case inline (as the real time box), but a Deadline of its own per call."""

    def _budget(self, start: float) -> tuple[float, bool]:
        if _DEADLINE.get() is None:
            return self.policy.seconds, False
        return self.policy._budget(start)


DOC = {
    "resources": {
        "dep": {
            "circuit_breaker": {"minimum_calls": 20},
            "retry": {"attempts": 3, "backoff": {"kind": "exponential", "jitter": "full"}},
        }
    }
}


def _resource(fn: Callable[..., Any], *, metrics: bool, apart: bool) -> Callable[[], Any]:
    """The config group's resource (breaker + retry); ``apart``: its breaker on another clock."""
    resource = Registry(DOC, metrics=metrics).get("dep")
    if apart:
        resource.use(
            (
                floodwall.CircuitBreaker("dep", minimum_calls=20, clock=_OtherClock()),
                floodwall.Retry("dep", attempts=3, backoff=FullJitter(0.1, cap=10.0)),
            )
        )
    return resource(fn)


def _tally_cases() -> list[Case]:
    tally = Tally()
    counter = tally.counter
    add = tally.add

    def bump_next(n: int) -> None:
        for _ in repeat(None, n):
            next(counter)

    def bump_add(n: int) -> None:
        for _ in repeat(None, n):
            add()

    return [
        Case(TALLY, TALLY_OFF, loop=bump_add, ref="add"),
        Case(TALLY, TALLY_ON, loop=bump_next),
    ]


def _entry_cases() -> list[Case]:
    def loop(box: type[timebox.Timebox] | None) -> Callable[[int], Awaitable[None]]:
        policy = floodwall.Timeout(1.0)
        if box is not None:
            policy.scope = box(policy)
        call = policy.call_async

        async def run(n: int) -> None:
            for _ in repeat(None, n):
                await call(af)

        return run

    return [
        Case(ENTRY, ENTRY_NONE, aloop=loop(_Plain), ref="neither"),
        Case(ENTRY, ENTRY_OFF, aloop=loop(_EntryApart), ref="own deadline"),
        Case(ENTRY, ENTRY_OUTLINE, aloop=loop(_Outline), ref="outline"),
        Case(ENTRY, ENTRY_ON, aloop=loop(None)),
    ]


FUSED_DOC = {
    "resources": {
        "dep": {
            "circuit_breaker": {"minimum_calls": 20},
            "bulkhead": {"max_concurrent": 1000},
            "retry": {"attempts": 2},
            "timeout": "2s",
        }
    }
}


def _fused_cases() -> list[Case]:
    def resource(nested: bool) -> floodwall.Pipeline:
        dep = Registry(FUSED_DOC).get("dep")
        (runner, plan), *rest = dep._async_stages
        assert runner is drivers.fused_async, "the resource's stages are fused"
        assert not rest
        if nested:  # the stages fused_async stands for, innermost first
            stages: list[tuple[Callable[..., Any], Any]] = [
                (drivers.scoped_async, plan.scoped),
                (drivers.attempts_async, plan.attempts),
            ]
            stages += [(drivers.gate_async, plan.gate), (drivers.metered_async, plan.metered)]
            dep._use_stages(dep._stages, stages)
        return dep

    def loop(call: Callable[[], Awaitable[Any]]) -> Callable[[int], Awaitable[None]]:
        async def run(n: int) -> None:
            for _ in repeat(None, n):
                await call()

        return run

    nested, bound, through = resource(True), resource(False), resource(False)
    return [
        Case(FUSED, FUSED_OFF, aloop=loop(lambda: nested.call_async(af)), ref="nested"),
        Case(FUSED, FUSED_CLASS, aloop=loop(lambda: floodwall.Pipeline.call_async(through, af))),
        Case(FUSED, FUSED_ON, aloop=loop(lambda: bound.call_async(af))),
    ]


class _GenericWindow(floodwall.Frequency):
    """Sends its one-call arguments as a list, which the op decides on the generic road."""

    def __init__(self, limit: int, per: float) -> None:
        super().__init__(limit, per)
        self._one = list(self._one)  # type: ignore[assignment]


def _window_cases() -> list[Case]:
    keys = [f"user-{i}" for i in range(150_000)]

    def loop(frequency: floodwall.Frequency) -> Callable[[int], None]:
        allow = frequency.allow
        turn = cycle(keys)
        for _ in range(len(keys)):  # past the bound: every later call evicts
            allow(next(turn))

        def run(n: int) -> None:
            for key in islice(turn, n):
                allow(key)

        return run

    return [
        Case(WINDOW, WINDOW_OFF, loop=loop(_GenericWindow(5, 3600)), ref="generic"),
        Case(WINDOW, WINDOW_ON, loop=loop(floodwall.Frequency(5, 3600))),
    ]


def cases() -> list[Case]:
    return [
        Case(LANE, LANE_OFF, fn=_ShutLane("bench-shut")(f), ref="lane shut"),
        Case(LANE, LANE_ON, fn=floodwall.CircuitBreaker("bench-lane")(f)),
        Case(ALANE, LANE_OFF, afn=_ShutLane("bench-ashut")(af), ref="lane shut"),
        Case(ALANE, LANE_ON, afn=floodwall.CircuitBreaker("bench-alane")(af)),
        *_tally_cases(),
        Case(METER, METER_NONE, fn=_resource(f, metrics=False, apart=False), ref="no metrics"),
        Case(METER, METER_OFF, fn=_resource(f, metrics=True, apart=True), ref="meter alone"),
        Case(METER, METER_ON, fn=_resource(f, metrics=True, apart=False)),
        Case(AMETER, METER_NONE, afn=_resource(af, metrics=False, apart=False), ref="no metrics"),
        Case(AMETER, METER_OFF, afn=_resource(af, metrics=True, apart=True), ref="meter alone"),
        Case(AMETER, METER_ON, afn=_resource(af, metrics=True, apart=False)),
        *_entry_cases(),
        *_fused_cases(),
        *_window_cases(),
    ]


def targets() -> list[Target]:
    """Each shortcut's saving, as the ratio with it to without it (≤ 0.9 earns its place)."""
    return [
        Target(LANE, LANE_ON, LANE_OFF, 0.9, "shortcut: gate lane, breaker sync"),
        Target(ALANE, LANE_ON, LANE_OFF, 0.9, "shortcut: gate lane, breaker async"),
        Target(TALLY, TALLY_ON, TALLY_OFF, 0.9, "shortcut: next(tally.counter), one bump"),
        Target(METER, METER_ON, METER_OFF, 0.9, "shortcut: meter folded into its runner, sync"),
        Target(AMETER, METER_ON, METER_OFF, 0.9, "shortcut: meter folded into its runner, async"),
        Target(ENTRY, ENTRY_ON, ENTRY_OFF, 0.9, "shortcut: timeout entry as deadline"),
        Target(ENTRY, ENTRY_ON, ENTRY_OUTLINE, 0.9, "shortcut: timeout box, common case inline"),
        Target(FUSED, FUSED_ON, FUSED_OFF, 0.9, "shortcut: fused async stages"),
        Target(WINDOW, WINDOW_ON, WINDOW_OFF, 0.9, "shortcut: fixed window inline on memory://"),
    ]
