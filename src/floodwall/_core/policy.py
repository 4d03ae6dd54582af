"""The shape every policy shares: ``call``, ``call_async`` and use as a decorator.

A policy is a decision core run by the two drivers (:mod:`floodwall._core.drivers`):
``call(fn, *args)`` runs a plain callable, ``await call_async(fn, *args)`` a coroutine function;
decorating picks the right one from the function's kind and keeps its signature for type
checkers. Policies take their ``call``/``call_async`` from a shape in
:mod:`floodwall._core.admission` (gate, flow, attempt-first flow, scoped) and write only its
hooks.
"""

from __future__ import annotations

import functools
import inspect
import types
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from floodwall._core.events import EventListener, Listeners

__all__ = ["Policy"]

P = ParamSpec("P")
R = TypeVar("R")


class Policy(ABC):
    """Base of every floodwall policy.

    :meth:`call` and :meth:`call_async` come from a shape of :mod:`floodwall._core.admission`
    (the drivers'); everything else (decorating, composing in a :class:`~floodwall.Pipeline`) is
    built on those two.
    """

    name: str
    kind: str = "policy"
    """Stable short name of the policy class, used in events and metrics."""
    listeners: Listeners
    """Who hears this policy's events (see :class:`~floodwall.Event`)."""

    @abstractmethod
    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` under this policy."""

    @abstractmethod
    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Await ``fn(*args, **kwargs)`` under this policy."""

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate ``fn``; coroutine functions go through :meth:`call_async`."""
        # (the class's call_async, bound: a pipeline binds its current stage on the instance,
        # which a reload replaces; the decorated function must see the stages of each call)
        shell = (
            types.MethodType(type(self).call_async, self)
            if inspect.iscoroutinefunction(fn)
            else self.call
        )
        return functools.update_wrapper(_Decorated(shell, fn), fn)

    def add_listener(self, listener: EventListener) -> None:
        """Subscribe ``listener`` to this policy's events."""
        self.listeners.add(listener)

    def describe(self) -> str:
        """One line naming the policy and its main settings (pipelines print these in order)."""
        return f"{type(self).__name__}({self.name!r})"

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class _Decorated(functools.partial):  # type: ignore[type-arg]
    """What a policy's decorator returns: ``shell(fn, *args, **kwargs)``.

    A :class:`functools.partial` is called by C code, so decorating adds no Python frame to
    each call (it matters on the rejection path of an outage). ``__get__`` makes it bind like
    a function when it decorates a method; ``update_wrapper`` gives it ``fn``'s name, docs
    and ``__wrapped__``, from which :func:`inspect.signature` reads the real signature.
    """

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)
