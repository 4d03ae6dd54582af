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

from floodwall._core.errors import ConfigError
from floodwall._core.events import EventListener
from floodwall._core.policy import Policy

__all__ = ["Pipeline"]

P = ParamSpec("P")
R = TypeVar("R")


class Pipeline(Policy):
    """Policies applied outermost-first around a call."""

    kind = "pipeline"

    def __init__(self, *policies: Policy, name: str = "pipeline") -> None:
        for index, policy in enumerate(policies):
            if not isinstance(policy, Policy):
                raise ConfigError(f"policies[{index}] must be a floodwall Policy, got {policy!r}")
        self.policies: tuple[Policy, ...] = policies
        self.name = name
        self._shells = tuple(policy.call for policy in reversed(policies))
        self._async_shells = tuple(policy.call_async for policy in reversed(policies))

    def call(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        # Each step is a C-level partial: ``outer.call(partial(inner.call, ... fn))``, so
        # composing adds no Python frame of its own between the policies.
        call: Callable[..., Any] = fn
        for shell in self._shells:
            call = partial(shell, call)
        return call(*args, **kwargs)  # type: ignore[no-any-return]

    async def call_async(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        call: Callable[..., Any] = fn
        for shell in self._async_shells:
            call = partial(shell, call)
        return await call(*args, **kwargs)  # type: ignore[no-any-return]

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
