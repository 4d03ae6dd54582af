"""The step that hands back what a user hook answered instead of the call.

A policy that answers for a call it refuses to make (a :class:`~floodwall.degrade.SampledDrop`'s
``drop_factory``) returns the hook's value as it is to a sync caller, and awaits it first for an
async caller when it is awaitable (an ``async def`` factory), so one hook serves both worlds.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from floodwall._core.steps import Step

__all__ = ["Answer"]


class Answer(Step):
    """Send back ``value``: as is in a thread; awaited in a task when it is awaitable."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def run(self, call: Callable[[], Any]) -> Any:
        return self.value

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        value = self.value
        if inspect.isawaitable(value):
            return await value
        return value

    def __repr__(self) -> str:
        return f"Answer({type(self.value).__name__})"
