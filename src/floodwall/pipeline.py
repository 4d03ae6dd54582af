"""Composition: ``Pipeline(p1, p2, p3)`` runs a call through p1, then p2, then p3.

The one rule: **the first policy is the outermost**. ``Pipeline(fallback, breaker, timeout)``
means the fallback sees what the breaker lets out, the breaker counts what the timeout lets out,
and the timeout bounds the call itself. ``print(pipeline)`` shows the order.

A pipeline is itself a policy: it decorates, nests in another pipeline, and has the same
``call``/``call_async`` shells. Its policies are fixed when it is built.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any, ParamSpec, TypeVar

from floodwall._core import validate
from floodwall._core.admission import Gate
from floodwall._core.drivers import (
    Metered,
    fuse,
    fused_async,
    gate_async,
    gate_sync,
    gates_async,
    gates_sync,
    metered_async,
    metered_sync,
)
from floodwall._core.errors import ConfigError
from floodwall._core.events import EventListener
from floodwall._core.meter import Metering
from floodwall._core.policy import Policy

__all__ = ["ANSWERING", "Pipeline", "answering"]

P = ParamSpec("P")
R = TypeVar("R")

ANSWERING = frozenset({"fallback", "cache", "fallback_source"})
"""Kinds of policy that can answer without the dependency: what still runs when it must not be
called (its level is shed, or the request's deadline passed before it was sent)."""


class Pipeline(Policy):
    """Policies applied outermost-first around a call."""

    kind = "pipeline"

    def __init__(self, *policies: Policy, name: str = "pipeline") -> None:
        for index, policy in enumerate(policies):
            if not isinstance(policy, Policy):
                raise ConfigError(f"policies[{index}] must be a floodwall Policy, got {policy!r}")
        self.policies: tuple[Policy, ...] = policies
        self.name = validate.text("name", name)
        self._use_stages(*_stages(policies))

    def _use_stages(self, stages: list[_Stage], async_stages: list[_Stage]) -> None:
        """Run ``stages`` (sync) and ``async_stages`` from the next call on.

        A single async stage (a fused pipeline: :func:`~floodwall._core.drivers.fused_async`)
        is also bound as this instance's ``call_async``: ``partial(runner, stage)``, whose call
        returns the runner's coroutine itself, one coroutine fewer per call than the method's
        ``await``, and still a coroutine function to :func:`inspect.iscoroutinefunction`
        (benchmark group "fused async stages": 40.8 k -> 37.6 k instructions per call; the
        gateway, 305 k -> 302 k per request). Not when a subclass writes its own
        ``call_async``."""
        self._stages = stages
        self._async_stages = async_stages
        if len(async_stages) == 1 and type(self).call_async is Pipeline.call_async:
            runner, stage = async_stages[0]
            vars(self)["call_async"] = partial(runner, stage)
        else:
            vars(self).pop("call_async", None)

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        # Each stage is a C-level partial, ``runner(stage, inner)``, built innermost first.
        call: Callable[..., Any] = fn
        for runner, stage in self._stages:
            call = partial(runner, stage, call)
        return call(*args, **kwargs)  # type: ignore[no-any-return]

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        stages = self._async_stages
        if len(stages) == 1:  # (a fused pipeline: drivers.fused_async) no partial to build
            runner, stage = stages[0]
            return await runner(stage, fn, *args, **kwargs)  # type: ignore[no-any-return]
        call: Callable[..., Any] = fn
        for runner, stage in stages:
            call = partial(runner, stage, call)
        return await call(*args, **kwargs)  # type: ignore[no-any-return]

    def answering(self) -> Pipeline:
        """The policies that can answer without the dependency (:data:`ANSWERING`), in order:
        what runs around a call that must not be made."""
        flat = [p for policy in self.policies for p in _stages_of(policy)]
        return Pipeline(*(p for p in flat if p.kind in ANSWERING), name=self.name)

    def add_listener(self, listener: EventListener) -> None:
        """Subscribe ``listener`` to the events of every policy in the pipeline."""
        for policy in self.policies:
            policy.add_listener(listener)

    def describe(self) -> str:
        inner = " -> ".join(policy.describe() for policy in self.policies)
        return f"Pipeline({self.name!r}: {inner} -> call)" if inner else "Pipeline(call)"

    def __str__(self) -> str:
        return " -> ".join([*(p.describe() for p in self.policies), "call"])

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def __len__(self) -> int:
        return len(self.policies)


def answering(policy: Policy) -> Policy | None:
    """What of ``policy`` can answer without the dependency: a pipeline's answering policies
    (:meth:`Pipeline.answering`; a config resource's include its meter), the policy itself if it
    is one of :data:`ANSWERING`, else ``None``."""
    if isinstance(policy, Pipeline):
        return policy.answering()
    return policy if policy.kind in ANSWERING else None


_Stage = tuple[Callable[..., Any], Any]


def chain(stages: list[_Stage], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped in ``stages`` (innermost first), as :meth:`Pipeline.call` runs them."""
    call = fn
    for runner, stage in stages:
        call = partial(runner, stage, call)
    return call


def _stages(
    policies: tuple[Policy, ...],
    metering: Metering | None = None,
    now: Callable[[], float] | None = None,
) -> tuple[list[_Stage], list[_Stage]]:
    """The runners of a pipeline, innermost first: one per flow, one per run of gates.

    Nested pipelines are flattened (composition is associative); consecutive gates share one
    admission loop (:func:`~floodwall._core.drivers.gates_sync`), so ``Pipeline(breaker,
    bulkhead, limiter)`` admits in order and records in reverse without nesting frames. Any
    other policy runs through its own ``call``. ``metering`` (a config resource's meter, read on
    ``now``) goes around everything, taking the outermost gate into its runner when they share
    its clock. Async stages of the usual shape (meter, a gate, retry, timeout: see
    :func:`~floodwall._core.drivers.fuse`) become one runner, :func:`fused_async`.
    """
    flat: list[Policy] = []
    for policy in policies:
        flat.extend(_stages_of(policy))
    sync: list[_Stage] = []
    async_: list[_Stage] = []
    run: list[Gate] = []
    if metering is not None:
        assert now is not None, "a metering needs the clock it reads"
        # the meter takes the outermost gate into its runner when they share a clock
        first = flat[0] if flat else None
        gate = first if isinstance(first, Gate) and first._now == now else None
        if gate is not None:
            del flat[0]
        metered = Metered(metering, now, gate)
        sync.append((metered_sync, metered))
        async_.append((metered_async, metered))

    def close_run() -> None:
        if len(run) == 1:
            sync.append((gate_sync, run[0]))
            async_.append((gate_async, run[0]))
        elif run:
            sync.append((gates_sync, tuple(run)))
            async_.append((gates_async, tuple(run)))
        run.clear()

    for policy in flat:
        if isinstance(policy, Gate):
            run.append(policy)
            continue
        close_run()
        sync.append((type(policy).call, policy))
        async_.append((type(policy).call_async, policy))
    close_run()
    plan = fuse(async_)  # the usual shape runs in one coroutine (drivers.fused_async)
    if plan is not None:
        async_ = [(fused_async, plan)]
    sync.reverse()
    async_.reverse()
    return sync, async_


def _stages_of(policy: Policy) -> tuple[Policy, ...]:
    if type(policy) is Pipeline:  # a subclass (a config resource) runs as itself
        return tuple(p for inner in policy.policies for p in _stages_of(inner))
    return (policy,)
