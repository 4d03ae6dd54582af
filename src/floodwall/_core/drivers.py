"""The two drivers: the only code that runs a policy's hooks around a real call.

Every policy's ``call`` is :func:`gate_sync` or :func:`flow_sync` (bound as the method), and
every ``call_async`` the matching ``*_async`` function; a :class:`~floodwall.Pipeline` chains
the same runners, one per stage. Each sync function here has an async twin that differs only
where a thread and a task differ (``await``); nothing else in the package writes a call body.

Costs: a gate adds two Python calls to the protected call (``admit`` and ``record``), none
while it keeps an open lane (:attr:`~floodwall._core.admission.Gate.lane`: a CLOSED breaker);
a flow a generator and one ``send`` per step; a scoped policy one call of its scope. The gate
runners take the hooks and the lane from the instance each call, so ``reconfigure()`` and
subclass overrides are always seen. A config resource's meter has its own runner
(:func:`metered_sync`), which takes the resource's outermost gate in.
"""

from __future__ import annotations

from bisect import bisect_right as _bisect
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from floodwall._core import meter as _meter
from floodwall._core.meter import EDGES, Metering
from floodwall._core.steps import CALL, FlowSteps, Wait

# Assigned, not imported by name: CPython 3.11 calls a method of an import-bound name through
# a bound method made per call (docs/gateway.md, "A fifth pass").
DEGRADED = _meter.DEGRADED

if TYPE_CHECKING:
    from floodwall._core.admission import Attempts, Flow, Gate, Lane, Scoped

__all__ = [
    "Fused",
    "Metered",
    "attempts_async",
    "attempts_sync",
    "drive_async",
    "drive_sync",
    "flow_async",
    "flow_sync",
    "fused_async",
    "gate_async",
    "gate_sync",
    "gates_async",
    "gates_sync",
    "metered_async",
    "metered_sync",
    "scoped_async",
    "scoped_sync",
]

P = ParamSpec("P")
R = TypeVar("R")


# -- one gate --------------------------------------------------------------------------------


def gate_sync(gate: Gate, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Admit, call, record: a gate's ``call`` (through its open lane when it has one)."""
    now = gate._now
    start = now()
    lane = gate.lane  # the gate's open lane: benchmark group "gate lane: ..., sync"
    if lane is None:
        try:
            permit = gate.admit(start, args, kwargs)
        except Wait as wait:
            permit = wait_sync(gate, wait)
            start = now()
    else:
        permit = lane[0]
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        end = now()
        gate.record(permit, end, end - start, exc, None)
        raise
    end = now()
    if lane is None or lane is not gate.lane or not lane[1](end, end - start):
        gate.record(permit, end, end - start, None, result)
    return result


async def gate_async(
    gate: Gate, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`gate_sync` for coroutine functions: a gate's ``call_async``."""
    now = gate._now
    start = now()
    lane = gate.lane  # the gate's open lane: benchmark group "gate lane: ..., async"
    if lane is None:
        try:
            permit = gate.admit(start, args, kwargs)
        except Wait as wait:
            permit = await wait_async(gate, wait)
            start = now()
    else:
        permit = lane[0]
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        end = now()
        gate.record(permit, end, end - start, exc, None)
        raise
    end = now()
    if lane is None or lane is not gate.lane or not lane[1](end, end - start):
        gate.record(permit, end, end - start, None, result)
    return result


def wait_sync(gate: Gate, wait: Wait) -> Any:
    """Perform the steps a gate asked to wait for until it hands out a permit (or refuses)."""
    while True:
        step = wait.step
        value = step.run(_no_call)
        try:
            return gate.resume(step, value, gate._now())
        except Wait as again:
            wait = again


async def wait_async(gate: Gate, wait: Wait) -> Any:
    """:func:`wait_sync` for tasks."""
    while True:
        step = wait.step
        value = await step.arun(_no_call_async)
        try:
            return gate.resume(step, value, gate._now())
        except Wait as again:
            wait = again


def _no_call() -> Any:
    raise RuntimeError("a gate's wait step cannot run the protected call")


async def _no_call_async() -> Any:
    _no_call()


# -- several gates in a row (a pipeline's stage), a resource's meter -------------------------------


class Metered:
    """A config resource's meter (``metering``, read on ``now``) and the outermost gate it takes
    into its runner (``gate``, or ``None``): what :func:`metered_sync` runs. Built with the
    resource's stages."""

    __slots__ = ("gate", "metering", "now")

    def __init__(
        self, metering: Metering, now: Callable[[], float], gate: Gate | None = None
    ) -> None:
        self.metering = metering
        self.now = now
        self.gate = gate


def gates_sync(
    gates: Sequence[Gate], fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """Admit outermost first, call, record in reverse.

    A gate that refuses (or fails to admit) ends the call there: the gates already passed
    record its exception as the outcome, as they would had it come from the call itself.
    """
    admitted: list[tuple[Gate, Any, float, Lane | None]] = []
    try:
        for gate in gates:
            start = gate._now()
            lane = gate.lane
            if lane is not None:
                admitted.append((gate, lane[0], start, lane))
                continue
            try:
                permit = gate.admit(start, args, kwargs)
            except Wait as wait:
                permit = wait_sync(gate, wait)
                start = gate._now()
            admitted.append((gate, permit, start, None))
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _record_all(admitted, exc, None)
        raise
    _record_all(admitted, None, result)
    return result


async def gates_async(
    gates: Sequence[Gate], fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`gates_sync` for coroutine functions."""
    admitted: list[tuple[Gate, Any, float, Lane | None]] = []
    try:
        for gate in gates:
            start = gate._now()
            lane = gate.lane
            if lane is not None:
                admitted.append((gate, lane[0], start, lane))
                continue
            try:
                permit = gate.admit(start, args, kwargs)
            except Wait as wait:
                permit = await wait_async(gate, wait)
                start = gate._now()
            admitted.append((gate, permit, start, None))
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        _record_all(admitted, exc, None)
        raise
    _record_all(admitted, None, result)
    return result


def _record_all(
    admitted: list[tuple[Gate, Any, float, Lane | None]], error: BaseException | None, result: Any
) -> None:
    for gate, permit, start, lane in reversed(admitted):
        end = gate._now()
        if error is None and lane is not None and lane is gate.lane and lane[1](end, end - start):
            continue  # counted in the gate's open lane
        gate.record(permit, end, end - start, error, result)


def metered_sync(run: Metered, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """A config resource's meter around the call and its outermost gate, if it has one.

    The meter is folded into this runner rather than run as a gate of its own: it shares the
    gate's two clock readings, and a success costs two context reads and one counter bump
    (benchmark groups "meter folded into its runner, ..." and "config-built resource ...").
    """
    metering = run.metering
    now = run.now
    gate = run.gate
    before = DEGRADED.get()  # a new marker after the call means a fallback inside answered
    start = first = now()
    held = False
    try:
        if gate is not None:
            lane = gate.lane
            if lane is None:
                try:
                    permit = gate.admit(start, args, kwargs)
                except Wait as wait:
                    permit = wait_sync(gate, wait)
                    start = now()
            else:
                permit = lane[0]
            held = True
        result = fn(*args, **kwargs)
    except BaseException as exc:
        end = now()
        if held:
            gate.record(permit, end, end - start, exc, None)  # type: ignore[union-attr]
        metering.failed(exc, end - first)
        raise
    end = now()
    duration = end - first
    index = _bisect(EDGES, duration)  # the meter's bin, which the gate's lane counts in too
    if held and (
        lane is None
        or lane is not gate.lane  # type: ignore[union-attr]
        or not (lane[2](end, duration, index) if start == first else lane[1](end, end - start))
    ):
        gate.record(permit, end, end - start, None, result)  # type: ignore[union-attr]
    marker = DEGRADED.get()
    if marker is before or marker is None or marker.claimed:
        next(metering.bins[index])
    else:
        metering.degraded(marker, duration)
    return result


async def metered_async(
    run: Metered, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`metered_sync` for coroutine functions."""
    metering = run.metering
    now = run.now
    gate = run.gate
    before = DEGRADED.get()
    start = first = now()
    held = False
    try:
        if gate is not None:
            lane = gate.lane
            if lane is None:
                try:
                    permit = gate.admit(start, args, kwargs)
                except Wait as wait:
                    permit = await wait_async(gate, wait)
                    start = now()
            else:
                permit = lane[0]
            held = True
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        end = now()
        if held:
            gate.record(permit, end, end - start, exc, None)  # type: ignore[union-attr]
        metering.failed(exc, end - first)
        raise
    end = now()
    duration = end - first
    index = _bisect(EDGES, duration)  # the meter's bin, which the gate's lane counts in too
    if held and (
        lane is None
        or lane is not gate.lane  # type: ignore[union-attr]
        or not (lane[2](end, duration, index) if start == first else lane[1](end, end - start))
    ):
        gate.record(permit, end, end - start, None, result)  # type: ignore[union-attr]
    marker = DEGRADED.get()
    if marker is before or marker is None or marker.claimed:
        next(metering.bins[index])
    else:
        metering.degraded(marker, duration)
    return result


# -- flows -----------------------------------------------------------------------------------


def flow_sync(policy: Flow, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a flow's steps around ``fn(*args, **kwargs)``: a flow's ``call``."""
    return drive_sync(policy.flow(args, kwargs), partial(fn, *args, **kwargs))  # type: ignore[no-any-return]


async def flow_async(
    policy: Flow, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`flow_sync` for coroutine functions: a flow's ``call_async``."""
    return await drive_async(policy.flow(args, kwargs), partial(fn, *args, **kwargs))  # type: ignore[no-any-return]


def drive_sync(steps: FlowSteps, call: Callable[[], Any]) -> Any:
    """Perform each step the generator yields, send its value back (or throw its exception in),
    and return what the generator returns."""
    send = steps.send
    try:
        step = send(None)
        while True:
            try:
                value = call() if step is CALL else step.run(call)
            except BaseException as exc:  # noqa: BLE001 - the flow decides what it handles
                step = steps.throw(exc)
            else:
                step = send(value)
    except StopIteration as done:
        return done.value


async def drive_async(steps: FlowSteps, call: Callable[[], Awaitable[Any]]) -> Any:
    """:func:`drive_sync` in a task."""
    send = steps.send
    try:
        step = send(None)
        while True:
            try:
                value = await call() if step is CALL else await step.arun(call)
            except BaseException as exc:  # noqa: BLE001 - the flow decides what it handles
                step = steps.throw(exc)
            else:
                step = send(value)
    except StopIteration as done:
        return done.value


# -- attempt-first flows (retry) ---------------------------------------------------------------


def attempts_sync(policy: Attempts, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``begin``, the first attempt, ``after``; the rest as steps only if ``after`` asks."""
    begun = policy.begin(args, kwargs)
    settled = begun.__class__ is policy.settled
    try:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            rest = policy.after(begun, exc, None)
            if rest is None:
                raise
        else:
            rest = None if settled else policy.after(begun, None, result)
            if rest is None:
                return result
        return drive_sync(rest, partial(fn, *args, **kwargs))  # type: ignore[no-any-return]
    finally:
        if not settled:
            policy.end(begun)


async def attempts_async(
    policy: Attempts, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`attempts_sync` for coroutine functions."""
    begun = policy.begin(args, kwargs)
    settled = begun.__class__ is policy.settled
    try:
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            rest = policy.after(begun, exc, None)
            if rest is None:
                raise
        else:
            rest = None if settled else policy.after(begun, None, result)
            if rest is None:
                return result
        return await drive_async(rest, partial(fn, *args, **kwargs))  # type: ignore[no-any-return]
    finally:
        if not settled:
            policy.end(begun)


# -- scoped policies (timeout, hedge) ---------------------------------------------------------


def scoped_sync(policy: Scoped, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the call inside the policy's scope: a scoped policy's ``call``."""
    return policy.scope.run(fn, args, kwargs)  # type: ignore[no-any-return]


async def scoped_async(
    policy: Scoped, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`scoped_sync` in a task."""
    return await policy.scope.arun(fn, args, kwargs)  # type: ignore[no-any-return]


# -- a pipeline's usual stages in one coroutine -------------------------------------------------


class Fused:
    """The async stages of a pipeline of the usual shape, run by :func:`fused_async` in one
    coroutine: a resource's meter (``metered``, with the gate it took in), one gate, an
    attempt-first flow (a retry) and a scoped policy (a timeout), each optional, in that order
    from the outside in. Built with the pipeline's stages (:func:`fuse`). ``timed`` is whether
    the gate reads the time it is given (:attr:`~floodwall._core.admission.Gate.untimed`)."""

    __slots__ = ("attempts", "gate", "metered", "scoped", "timed")

    def __init__(
        self,
        metered: Metered | None,
        gate: Gate | None,
        attempts: Attempts | None,
        scoped: Scoped | None,
    ) -> None:
        self.metered = metered
        self.gate = gate
        self.attempts = attempts
        self.scoped = scoped
        self.timed = gate is not None and not gate.untimed


_SHAPE = {"metered": 0, "gate": 1, "attempts": 2, "scoped": 3}
"""The places of the fused shape, outermost first."""


def fuse(stages: Sequence[tuple[Callable[..., Any], Any]]) -> Fused | None:
    """The :class:`Fused` plan of ``stages`` (a pipeline's async runners, outermost first) when
    they are a meter, one gate, a retry and a timeout in that order (each optional, at least
    two of them), else ``None``: any other runner keeps its own coroutine."""
    runners = {metered_async: "metered", gate_async: "gate"}
    runners.update({attempts_async: "attempts", scoped_async: "scoped"})
    found: dict[str, Any] = {}
    place = -1
    for runner, stage in stages:
        name = runners.get(runner)
        if name is None or _SHAPE[name] <= place:
            return None
        found[name] = stage
        place = _SHAPE[name]
    if len(found) < 2:  # one stage runs as well on its own
        return None
    return Fused(
        found.get("metered"), found.get("gate"), found.get("attempts"), found.get("scoped")
    )


async def fused_async(  # noqa: PLR0912, PLR0915 - four runners written out as one
    plan: Fused, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """:func:`metered_async`, :func:`gate_async`, :func:`attempts_async` and
    :func:`scoped_async` nested as a pipeline nests them, in one coroutine: the same hooks in
    the same order with the same clock readings (none for an untimed gate, which gets 0.0:
    :attr:`~floodwall._core.admission.Gate.untimed`), without a coroutine, a frame and a
    ``partial`` per stage (benchmark group "fused async stages": 51.0 k -> 40.8 k instructions
    per call; the gateway's typical route, 314 k -> 303 k per request)."""
    metered = plan.metered
    gate = plan.gate
    outer = None
    if metered is not None:
        now = metered.now
        outer = metered.gate
        before = DEGRADED.get()  # a new marker after the call means a fallback inside answered
        start = first = now()
    held = inside = False
    try:
        if outer is not None:  # the meter's gate, on the meter's clock reading
            lane = outer.lane
            if lane is None:
                try:
                    permit = outer.admit(start, args, kwargs)
                except Wait as wait:
                    permit = await wait_async(outer, wait)
                    start = now()
            else:
                permit = lane[0]
            held = True
        if gate is not None:
            timed = plan.timed  # (an untimed gate, a bulkhead: two clock readings fewer)
            gate_start = gate._now() if timed else 0.0
            gate_lane = gate.lane
            if gate_lane is None:
                try:
                    gate_permit = gate.admit(gate_start, args, kwargs)
                except Wait as wait:
                    gate_permit = await wait_async(gate, wait)
                    gate_start = gate._now() if timed else 0.0
            else:
                gate_permit = gate_lane[0]
            inside = True
        attempts = plan.attempts
        scoped = plan.scoped
        if attempts is None:
            if scoped is None:
                result = await fn(*args, **kwargs)
            else:
                result = await scoped.scope.arun(fn, args, kwargs)
        else:
            begun = attempts.begin(args, kwargs)
            settled = begun.__class__ is attempts.settled
            try:
                try:
                    if scoped is None:
                        result = await fn(*args, **kwargs)
                    else:
                        result = await scoped.scope.arun(fn, args, kwargs)
                except Exception as exc:
                    rest = attempts.after(begun, exc, None)
                    if rest is None:
                        raise
                else:
                    rest = None if settled else attempts.after(begun, None, result)
                if rest is not None:
                    again = (
                        partial(fn, *args, **kwargs)
                        if scoped is None
                        else partial(scoped_async, scoped, fn, *args, **kwargs)
                    )
                    result = await drive_async(rest, again)
            finally:
                if not settled:
                    attempts.end(begun)
    except BaseException as exc:
        if inside:
            end = gate._now() if timed else 0.0  # type: ignore[union-attr]
            gate.record(gate_permit, end, end - gate_start, exc, None)  # type: ignore[union-attr]
        if metered is not None:
            end = now()
            if held:
                outer.record(permit, end, end - start, exc, None)  # type: ignore[union-attr]
            metered.metering.failed(exc, end - first)
        raise
    if inside:
        end = gate._now() if timed else 0.0  # type: ignore[union-attr]
        lane_held = gate_lane is not None and gate_lane is gate.lane  # type: ignore[union-attr]
        if not lane_held or not gate_lane[1](end, end - gate_start):  # type: ignore[index]
            gate.record(gate_permit, end, end - gate_start, None, result)  # type: ignore[union-attr]
    if metered is None:
        return result
    end = now()
    duration = end - first
    index = _bisect(EDGES, duration)  # the meter's bin, which its gate's lane counts in too
    if held and (
        lane is None
        or lane is not outer.lane  # type: ignore[union-attr]
        or not (lane[2](end, duration, index) if start == first else lane[1](end, end - start))
    ):
        outer.record(permit, end, end - start, None, result)  # type: ignore[union-attr]
    marker = DEGRADED.get()
    if marker is before or marker is None or marker.claimed:
        next(metered.metering.bins[index])
    else:
        metered.metering.degraded(marker, duration)
    return result
