"""The one request path: every policy is a gate (admit, then record) or a flow (a step machine).

**Gates** can refuse or observe a call: breakers, bulkheads, rate limiters, adaptive limiters,
shedders, level and priority gates, sampled drops, chaos. A gate writes two pure hooks:

* ``admit(now, args, kwargs)`` returns a *permit* (any value the gate wants handed back), or
  raises the typed :class:`~floodwall.RejectedError` that refuses the call. A gate that may make
  the caller wait for its permit raises :class:`Wait` with the :class:`Step` to perform; the
  driver performs it (sleeping or parking the thread or the task) and calls ``resume``.
* ``record(permit, now, duration, error, result)`` learns how the admitted call ended: ``error``
  is the exception (``None`` on a return), ``result`` the return value, ``duration`` the seconds
  from admission to the end. Gates classify the outcome themselves (see
  :mod:`floodwall._core.outcome`); a gate that only needs to free what it holds ignores the rest.

**Flows** loop or wait around the call: retry, hedge, timeout, fallback, cache, idempotency.
A flow writes one generator, ``flow(args, kwargs)``, that yields :class:`Step` instructions
(:data:`CALL` to run the protected call, :class:`Sleep`, :class:`Apply` for a store operation,
:class:`Await` for an awaitable a user hook returned) and returns the call's answer. The value
of a step is sent back into the generator; an exception the step raised is thrown into it at
the ``yield``. Sync and async behaviour is therefore the same by construction: only
:mod:`floodwall._core.drivers` knows threads, tasks, sleeping and cancellation.

This is tenacity's "attempt / sleep / done" iteration and httpx's generator auth flows, applied
to every policy; Polly v8's single execution path is the same idea.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from floodwall._core import drivers
from floodwall._core.policy import Policy
from floodwall._core.steps import FlowSteps, Scope, Step

__all__ = ["Attempts", "Flow", "Gate", "Lane", "Scoped"]

Lane = tuple[Any, Callable[[float, float], bool], Callable[[float, float, int], bool]]
"""A gate's open lane: ``(permit, tally, tally_in)`` (see :attr:`Gate.lane`)."""


class Gate(Policy):
    """A policy that admits a call and records its outcome (see :mod:`floodwall._core.admission`).

    ``call`` / ``call_async`` are the drivers' (:mod:`floodwall._core.drivers`); a gate writes
    :meth:`admit`, :meth:`record` and, if it can make callers wait, :meth:`resume`. ``_now`` is
    the gate's clock reading (``clock.monotonic``), set by the subclass.
    """

    _now: Callable[[], float]

    lane: Lane | None = None
    """The gate's open lane, or ``None`` (the default: every call runs :meth:`admit` and
    :meth:`record`). While it is ``(permit, tally, tally_in)``, the gate would admit any call
    with ``permit`` without deciding anything, so the drivers skip ``admit``; and when a call so
    admitted returns while ``lane`` is still the same object, ``tally(now, duration)`` counts
    the success lock-free (True) or declines (False, and ``record`` runs). ``tally_in(now,
    duration, index)`` is the same given the duration's latency bin
    (``bisect_right(EDGES, duration)``), which a resource's meter found for its own count. A
    gate replaces the tuple (or sets ``None``) whenever that stops being true. The breaker's
    CLOSED state is such a lane: two hook calls fewer per call (benchmark groups "gate lane:
    ...")."""

    untimed = False
    """Whether :meth:`admit` and :meth:`record` read neither ``now`` nor ``duration`` (a
    bulkhead's): then :func:`~floodwall._core.drivers.fused_async` passes 0.0 for both instead
    of reading the clock twice per call. A subclass that overrides either hook without setting
    it again reads the clock as usual (:meth:`__init_subclass__`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "untimed" not in own and ("admit" in own or "record" in own):
            cls.untimed = False

    call = drivers.gate_sync
    call_async = drivers.gate_async

    @abstractmethod
    def admit(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A permit for the call with ``args``/``kwargs`` at ``now``, or raise its rejection."""

    def record(
        self,
        permit: Any,
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        """Learn how the call admitted with ``permit`` ended (default: nothing to learn)."""

    def resume(self, step: Step, value: Any, now: float) -> Any:
        """After the driver performed the ``step`` of a :class:`Wait` (its value ``value``): a
        permit, or raise the rejection, or raise another :class:`Wait`."""
        raise NotImplementedError(f"{type(self).__name__} raised Wait but has no resume()")


class Flow(Policy):
    """A policy written as one step machine (see :mod:`floodwall._core.admission`)."""

    call = drivers.flow_sync
    call_async = drivers.flow_async

    @abstractmethod
    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """The steps of one call with ``args``/``kwargs``; returns the call's answer."""


class Attempts(Policy):
    """A flow whose first step is always the call, with the rest started only on a failure.

    Retrying is that shape: most calls succeed at once, and for them a generator per call would
    cost more than the whole policy. So the drivers run ``begin`` (before the first attempt),
    the call, then ``after``; only when ``after`` hands back steps does a step machine run, the
    same one in both worlds. ``end`` closes what ``begin`` opened, however the call ended.
    """

    call = drivers.attempts_sync
    call_async = drivers.attempts_async

    settled: type | None = None
    """The type of a :meth:`begin` value after which a returned first attempt stands as it is
    and :meth:`end` has nothing to close (a retry without ``retry_on_result``, begun without a
    deadline or a shared budget to reset): the drivers then skip ``after`` for a success and
    ``end`` (two calls fewer per call). ``None`` (the default): they always call both."""

    @abstractmethod
    def begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Before the first attempt: what ``after`` and ``end`` need to know of this call."""

    @abstractmethod
    def after(self, begun: Any, error: BaseException | None, result: Any) -> FlowSteps | None:
        """The first attempt ended: ``None`` if its outcome stands, else the steps of the rest
        (they may yield :data:`~floodwall._core.steps.CALL` again, and end with the answer)."""

    def end(self, begun: Any) -> None:
        """The call is over (default: nothing to close)."""


class Scoped(Policy):
    """A policy that runs every call inside one :class:`~floodwall._core.steps.Scope` of its own
    making (a time box, a race of attempts): no generator, no object per call. The constructor
    sets :attr:`scope` (a plain attribute: the drivers read it on every call)."""

    scope: Scope
    """The scope every call of this policy runs inside."""

    call = drivers.scoped_sync
    call_async = drivers.scoped_async
