"""The steps a flow hands to the driver, and the signal a waiting gate raises.

Each step's ``run``/``arun`` pair is the only place its sync and async forms differ; the
drivers (:mod:`floodwall._core.drivers`) call one or the other and know nothing else of it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias

from floodwall._core.errors import ConfigError

if TYPE_CHECKING:
    from floodwall._core.clock import Clock

__all__ = [
    "CALL",
    "Apply",
    "Await",
    "Either",
    "FlowSteps",
    "Invoke",
    "NeedsAsyncError",
    "Scope",
    "Sleep",
    "Step",
    "Wait",
]


class Step:
    """One instruction a flow (or a waiting gate) hands to the driver.

    ``run(call)`` performs it in a thread, ``arun(call)`` in a task; ``call`` runs the rest of
    the pipeline (only :data:`CALL` and steps that wrap the call use it). Each step's pair of
    methods is the only place its sync and async forms differ.
    """

    __slots__ = ()

    def run(self, call: Callable[[], Any]) -> Any:
        """Perform the step, blocking the calling thread."""
        raise NotImplementedError

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Perform the step in the running task."""
        raise NotImplementedError


class Scope:
    """What a scoped policy (a timeout, a hedge) runs every call inside, built once with it.

    ``run(fn, args, kwargs)`` performs the call in a thread, ``arun(fn, args, kwargs)`` in a
    task. Unlike a :class:`Step` it takes the call as it came, not as a ``partial``, and it
    keeps no state of one call: a call under a scoped policy allocates neither (benchmark group
    "async timeout").
    """

    __slots__ = ()

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``fn(*args, **kwargs)`` inside the scope, blocking the calling thread."""
        raise NotImplementedError

    async def arun(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Await ``fn(*args, **kwargs)`` inside the scope, in the running task."""
        raise NotImplementedError


class _Call(Step):
    """Run the protected call (the rest of the pipeline) and send back its result."""

    __slots__ = ()

    def run(self, call: Callable[[], Any]) -> Any:
        return call()

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return await call()

    def __repr__(self) -> str:
        return "CALL"


CALL: Final = _Call()
"""The step that runs the protected call; a flow may yield it more than once (retry, hedge)."""


class Sleep(Step):
    """Wait ``seconds`` on ``clock`` (a :class:`~floodwall.FakeClock` in tests), then go on."""

    __slots__ = ("clock", "seconds")

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds

    def run(self, call: Callable[[], Any]) -> None:
        self.clock.sleep(self.seconds)

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> None:
        await self.clock.async_sleep(self.seconds)

    def __repr__(self) -> str:
        return f"Sleep({self.seconds:g})"


class _Applies(Protocol):
    def apply(self, op: Any, key: str, args: Any = ...) -> Any: ...

    async def apply_async(self, op: Any, key: str, args: Any = ...) -> Any: ...


class Apply(Step):
    """Run ``target.apply(op, key, args)`` (a store, or a store guard) and send back its value.

    Stores mirror their sync and async adapters with identical names, so a flow that talks to a
    store is written once.
    """

    __slots__ = ("args", "key", "op", "target")

    def __init__(self, target: _Applies, op: Any, key: str, args: Any = ()) -> None:
        self.target = target
        self.op = op
        self.key = key
        self.args = args

    def run(self, call: Callable[[], Any]) -> Any:
        return self.target.apply(self.op, self.key, self.args)

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return await self.target.apply_async(self.op, self.key, self.args)

    def __repr__(self) -> str:
        return f"Apply({type(self.op).__name__}, {self.key!r})"


class Either(Step):
    """Call ``sync()`` in a thread or await ``async_()`` in a task: a library's own pair of
    methods for one act (httpx's ``Response.read`` / ``aread``), so the flow using it is
    written once."""

    __slots__ = ("async_", "sync")

    def __init__(self, sync: Callable[[], Any], async_: Callable[[], Awaitable[Any]]) -> None:
        self.sync = sync
        self.async_ = async_

    def run(self, call: Callable[[], Any]) -> Any:
        return self.sync()

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return await self.async_()

    def __repr__(self) -> str:
        return f"Either({getattr(self.sync, '__qualname__', self.sync)!s})"


class NeedsAsyncError(ConfigError):
    """A sync call met something only a task can run (an ``async def`` hook)."""


class Invoke(Step):
    """Call ``fn(*args, **kwargs)`` (through ``policy``, if given) in the caller's world.

    In a task, a coroutine function is awaited and a plain one called as it is; in a thread, a
    coroutine function is refused with :class:`NeedsAsyncError`, whose message starts with
    ``what`` ("fallback source 'x' has an async backup").
    """

    __slots__ = ("args", "fn", "kwargs", "policy", "what")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        policy: Any = None,
        what: str = "the function is an async def",
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.policy = policy
        self.what = what

    def run(self, call: Callable[[], Any]) -> Any:
        fn = self.fn
        if inspect.iscoroutinefunction(fn):
            raise NeedsAsyncError(f"{self.what}; use call_async()")
        if self.policy is None:
            return fn(*self.args, **self.kwargs)
        return self.policy.call(fn, *self.args, **self.kwargs)

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        fn = self.fn
        if not inspect.iscoroutinefunction(fn):
            plain = fn

            async def fn(*args: Any, **kwargs: Any) -> Any:
                return plain(*args, **kwargs)

        if self.policy is None:
            return await fn(*self.args, **self.kwargs)
        return await self.policy.call_async(fn, *self.args, **self.kwargs)


class Await(Step):
    """Await what a user hook returned (an async fallback factory); refused in sync calls."""

    __slots__ = ("awaitable", "what")

    def __init__(self, awaitable: Awaitable[Any], what: str) -> None:
        self.awaitable = awaitable
        self.what = what

    def run(self, call: Callable[[], Any]) -> Any:
        close = getattr(self.awaitable, "close", None)
        if close is not None:
            close()  # never awaited: close it so it does not warn later
        raise NeedsAsyncError(f"{self.what}; use call_async()")

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return await self.awaitable


class Wait(BaseException):
    """Raised by :meth:`Gate.admit` to ask the driver to perform ``step`` before admitting.

    A ``BaseException`` so that no ``except Exception`` between the gate and the driver takes
    it for a failure. Raising costs nothing on the common path (admission without a wait),
    where a returned marker would cost a type check on every call.
    """

    def __init__(self, step: Step) -> None:
        super().__init__(step)
        self.step = step


FlowSteps: TypeAlias = Generator[Step, Any, Any]
"""What :meth:`Flow.flow` returns: steps out, their values in, the call's answer at the end."""
