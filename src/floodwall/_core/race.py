"""Concurrent attempts of one call, the first success winning: the task mechanics of
:class:`~floodwall.Hedge`.

:class:`Race` is the step a hedge hands to the driver. The hedge keeps every decision (how long
to wait before the next attempt, whether the budget allows it, which failures end the race,
what a win records); the race only starts tasks, waits for the first to finish or for the
hedge timer, and cancels the losers. A thread cannot be cancelled, so there is no sync race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from floodwall._core.errors import ConfigError
from floodwall._core.steps import Scope

__all__ = ["Race", "Racer"]


class Racer(Protocol):
    """What a :class:`Race` asks of its policy."""

    name: str
    max_hedges: int
    on_failure: bool
    """Start the next attempt at once when one fails transiently (Polly's hedging)."""

    def _enter(self, start: float) -> Any:
        """The race starts: count it; what ``_leave`` needs back."""
        ...

    def _leave(self, token: Any) -> None: ...

    def _delay(self) -> Awaitable[None]:
        """Sleep until the next attempt is due."""
        ...

    def _more(self) -> bool:
        """Whether this call may start hedges at all."""
        ...

    def _may_hedge(self, launched: int) -> bool: ...

    def _launch(
        self, loop: asyncio.AbstractEventLoop, call: Callable[[], Awaitable[Any]], attempt: int
    ) -> asyncio.Task[Any]: ...

    def _ends_race(self, failure: BaseException) -> bool: ...

    def _all_failed(self, error: BaseException, launched: int) -> None: ...

    def _won(self, result: Any, attempt: int, began: float, launched: int) -> Any: ...

    def _abandon(
        self, running: dict[asyncio.Task[Any], tuple[int, float]], timer: asyncio.Task[None] | None
    ) -> None: ...

    def _now(self) -> float: ...


class Race(Scope):
    """Run each call, start another attempt each time the policy's delay passes unanswered."""

    __slots__ = ("policy",)

    def __init__(self, policy: Racer) -> None:
        self.policy = policy

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise ConfigError(
            f"Hedge {self.policy.name!r} hedges async calls only (use call_async or decorate an "
            "async def): a sync attempt cannot be cancelled, its losers would keep running in "
            "threads"
        )

    async def arun(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        policy = self.policy
        start = policy._now()
        call = partial(fn, *args, **kwargs)
        token = policy._enter(start)
        loop = asyncio.get_running_loop()
        running: dict[asyncio.Task[Any], tuple[int, float]] = {
            loop.create_task(call()): (1, start)  # type: ignore[arg-type]
        }
        launched = 1
        allowed = more = policy._more()
        timer: asyncio.Task[None] | None = None
        error: BaseException | None = None
        try:
            while True:
                if timer is None and more:
                    timer = loop.create_task(policy._delay())  # type: ignore[arg-type]
                waiting: set[asyncio.Future[Any]] = set(running)
                if timer is not None:
                    waiting.add(timer)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                failed = 0
                for task in sorted((t for t in done if t in running), key=lambda t: running[t]):
                    attempt, began = running.pop(task)
                    failure = task.exception()
                    if failure is None:
                        return policy._won(task.result(), attempt, began, launched)
                    error = failure
                    if policy._ends_race(failure):
                        raise failure
                    failed += 1
                while (
                    failed
                    and policy.on_failure
                    and allowed
                    and launched <= policy.max_hedges
                    and policy._may_hedge(launched)
                ):
                    failed -= 1
                    launched += 1
                    running[policy._launch(loop, call, launched)] = (launched, policy._now())
                    if timer is not None:  # the next delay counts from this attempt
                        timer.cancel()
                        timer = None
                    more = launched <= policy.max_hedges
                if not running:  # every attempt failed: a hedge answers slowness, not failure
                    assert error is not None
                    policy._all_failed(error, launched)
                    raise error
                if timer is not None and timer.done():
                    timer = None
                    more = policy._may_hedge(launched)
                    if more:
                        launched += 1
                        running[policy._launch(loop, call, launched)] = (launched, policy._now())
                        more = launched <= policy.max_hedges
        finally:
            error = None
            policy._abandon(running, timer)
            policy._leave(token)
