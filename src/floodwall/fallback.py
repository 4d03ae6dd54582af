"""Fallback: answer instead of the dependency when it fails or a policy refuses the call.

``Fallback(value=x)`` answers a constant; ``Fallback(factory=f)`` calls ``f(exception)`` (an
``async def`` factory is awaited by ``call_async``). Which failures it handles is chosen by
exception type (``on``, default any ``Exception``) and/or by kind (``kinds``, e.g.
``{"circuit_open", "timeout"}``: the outcome vocabulary of :class:`~floodwall.Outcomes`, which
``on`` also takes); when both are given, either matches. ``failure_result`` also
replaces results that count as failures (an HTTP 503 value).

A fallback answer is marked as degraded: the open :func:`floodwall.call_context` records which
fallback answered and why, for response headers and metrics; ``Fallback.degraded`` counts them.

``Fallback[T]`` is generic in its answer's type ``T`` (the value's type, or what the factory
returns or its awaitable yields), so a type checker sees a decorated ``def f() -> R`` return
``R | T``: ``Fallback(value=None)`` makes it ``R | None``, which a caller must handle. Only the
signatures change; ``call``/``call_async`` are still the drivers' (:mod:`floodwall._core.drivers`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, TypeVar, overload

from floodwall._core import validate
from floodwall._core.admission import Flow
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, FailedResult, RejectedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.meter import note_degraded
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.outcome import Outcomes, _kinds
from floodwall._core.steps import CALL, Await, FlowSteps
from floodwall.context import current_call

__all__ = ["Fallback", "FallbackOptions"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _Unset:
    """The ``value`` of a fallback that answers with a ``factory`` instead."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<no value>"


_UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class FallbackOptions:
    """A :class:`Fallback`'s options, validated once: exactly one of ``value`` (the answer) and
    ``factory`` (a callable of the exception making it); which failures it answers for, ``on``
    (exception types or an :class:`~floodwall.Outcomes`) and/or ``kinds`` (kind names), either
    matching, neither: any ``Exception``; ``failure_result``, a predicate on a returned value
    that counts it as a failure. ``handled`` is derived: ``on`` and ``kinds`` as one
    :class:`~floodwall.Outcomes`."""

    value: Any = _UNSET
    factory: Callable[[BaseException], Any] | None = None
    on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None
    kinds: Collection[str] | None = None
    failure_result: Callable[[Any], bool] | None = None
    handled: Outcomes = field(init=False, repr=False)

    CHECKS: ClassVar[Checks] = {
        "factory": optional(validate.function),
        "on": optional(Outcomes.of),
        "kinds": optional(_kinds),
        "failure_result": optional(partial(validate.function, what="a predicate")),
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if (self.value is _UNSET) == (self.factory is None):
            raise ConfigError(
                "give exactly one of value=... or factory=..., got "
                + ("both" if self.factory is not None else "neither")
            )
        object.__setattr__(self, "handled", Outcomes.handled(self.on, self.kinds))


class Fallback(Flow, Generic[T]):
    """Replace a failed call's outcome with ``value`` or ``factory(exception)``."""

    kind = "fallback"

    @overload
    def __init__(
        self,
        value: T,
        *,
        on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None,
        kinds: Collection[str] | None = None,
        failure_result: Callable[[Any], bool] | None = None,
        name: str = "fallback",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None: ...

    @overload
    def __init__(
        self,
        *,
        factory: Callable[[BaseException], Awaitable[T]],
        on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None,
        kinds: Collection[str] | None = None,
        failure_result: Callable[[Any], bool] | None = None,
        name: str = "fallback",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None: ...

    @overload
    def __init__(
        self,
        *,
        factory: Callable[[BaseException], T],
        on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None,
        kinds: Collection[str] | None = None,
        failure_result: Callable[[Any], bool] | None = None,
        name: str = "fallback",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None: ...

    def __init__(
        self,
        value: Any = _UNSET,
        *,
        factory: Callable[[BaseException], Any] | None = None,
        on: type[BaseException] | tuple[type[BaseException], ...] | Outcomes | None = None,
        kinds: Collection[str] | None = None,
        failure_result: Callable[[Any], bool] | None = None,
        name: str = "fallback",
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = FallbackOptions(value, factory, on, kinds, failure_result)
        """The validated :class:`FallbackOptions`, read once, here."""
        self.value = o.value
        self.factory = o.factory
        self.handled = o.handled
        """The errors this fallback answers for (``on=`` and ``kinds=``)."""
        self.failure_result = o.failure_result
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.degraded = 0
        """How many answers this fallback gave instead of the dependency."""

    if TYPE_CHECKING:
        # Only the types: at run time these are Flow's (the drivers' flow_sync/flow_async and
        # Policy's decorator). They widen Policy's ``R`` to ``R | T`` (hence the ignores: a
        # fallback answers something else than the call, by design), so a Pipeline, which
        # types its stages as plain policies, keeps the wrapped type.
        def call(  # type: ignore[override]
            self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
        ) -> R | T: ...

        async def call_async(  # type: ignore[override]
            self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
        ) -> R | T: ...

        @overload  # type: ignore[override]
        def __call__(
            self, fn: Callable[P, Coroutine[Any, Any, R]]
        ) -> Callable[P, Coroutine[Any, Any, R | T]]: ...

        @overload
        def __call__(self, fn: Callable[P, R]) -> Callable[P, R | T]: ...

        def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]: ...

    def handles(self, exc: BaseException) -> bool:
        """Whether this fallback answers for ``exc``."""
        return self.handled.error(exc)

    def _reason(self, exc: BaseException | None) -> str:
        if exc is None:
            return "failure_result"
        return exc.kind if isinstance(exc, RejectedError) else type(exc).__name__

    def _mark(self, exc: BaseException | None) -> None:
        self.degraded += 1
        reason = self._reason(exc)
        note_degraded(self.name, reason)
        context = current_call()
        if context is not None:
            context.degraded_by = self.name
            context.degraded_reason = reason
        if self.listeners:
            self.listeners.emit(
                Event("fallback", self.kind, self.name, self.clock.monotonic(), reason)
            )

    def _answer(self, exc: BaseException | None, result: object = None) -> Any:
        self._mark(exc)
        if self.factory is None:
            return self.value
        return self.factory(exc if exc is not None else FailedResult(self.name, result))

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """Call once; on a handled failure, answer instead (awaiting an async factory)."""
        try:
            result = yield CALL
        except BaseException as exc:
            if not self.handles(exc):
                raise
            answer = self._answer(exc)
        else:
            if self.failure_result is None or not self.failure_result(result):
                return result
            answer = self._answer(None, result)
        if inspect.isawaitable(answer):
            answer = yield Await(answer, f"fallback {self.name!r} has an async factory")
        return answer

    def describe(self) -> str:
        what = "factory" if self.factory is not None else f"value={self.value!r}"
        return f"Fallback({what})"
