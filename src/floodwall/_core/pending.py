"""A gate's wait written once, as a step generator that both worlds and ``admit`` share.

A limiter that may wait (``max_wait``) or talk to a store writes the decision as a generator of
steps (:class:`~floodwall._core.steps.Sleep`, a store round trip) that returns the answer. The
same generator then serves three callers:

* the public sync method: ``settle(steps)`` performs each step in the calling thread;
* the public async method: ``await settle_async(steps)`` performs them in the task;
* the gate's hooks: ``admit`` returns ``start(steps)``, which is the answer when no step was
  needed, else raises :class:`~floodwall._core.steps.Wait` with a :class:`Pending` step; the
  driver performs it and calls ``resume``, which returns ``advance(step, value)``.

A generator that refuses raises the typed rejection itself, so ``resume`` never needs to know
which question the generator was answering.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from floodwall._core.drivers import _no_call, _no_call_async, drive_async, drive_sync
from floodwall._core.steps import FlowSteps, Step, Wait

__all__ = ["Pending", "advance", "settle", "settle_async", "start"]


class Pending(Step):
    """The step a gate's generator is suspended at; performing it performs that step.

    If the step raises (a cancelled sleep, a timeout), the generator is closed, so its
    ``finally`` blocks run at once rather than whenever it is collected.
    """

    __slots__ = ("step", "steps")

    def __init__(self, steps: FlowSteps, step: Step) -> None:
        self.steps = steps
        self.step = step

    def run(self, call: Callable[[], Any]) -> Any:
        try:
            return self.step.run(call)
        except BaseException:
            self.steps.close()
            raise

    async def arun(self, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await self.step.arun(call)
        except BaseException:
            self.steps.close()
            raise

    def __repr__(self) -> str:
        return f"Pending({self.step!r})"


def start(steps: FlowSteps) -> Any:
    """The generator's answer if it needs no step, else raise ``Wait`` for its first one."""
    try:
        step = steps.send(None)
    except StopIteration as done:
        return done.value
    raise Wait(Pending(steps, step))


def advance(pending: Step, value: Any) -> Any:
    """Send ``value`` (what the pending step gave) in: the answer, or ``Wait`` for the next."""
    assert isinstance(pending, Pending), pending
    try:
        step = pending.steps.send(value)
    except StopIteration as done:
        return done.value
    pending.step = step
    raise Wait(pending)


def settle(steps: FlowSteps) -> Any:
    """Perform every step in the calling thread; the generator's answer."""
    return drive_sync(steps, _no_call)


async def settle_async(steps: FlowSteps) -> Any:
    """Perform every step in the running task; the generator's answer."""
    return await drive_async(steps, _no_call_async)
