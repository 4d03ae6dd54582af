"""What a benchmark module declares: :class:`Case` and :class:`Target`.

A benchmark module ``benchmarks/bench_*.py`` exposes ``cases() -> list[Case]`` and, optionally,
``targets() -> list[Target]``; ``benchmarks/run.py`` finds, times and reports them.

A case is measured as a *loop function* ``run(n)`` that performs its body ``n`` times; the timer
wraps one call of ``run(n)``, so a figure is the cost of one iteration of
``for _ in repeat(None, n): <body>``, loop bookkeeping included (a few ns, the same in every case
of a group; ``itertools.repeat`` rather than ``range``, which allocates an int per iteration).
Give either:

* ``fn`` (a plain callable) or ``afn`` (a coroutine function): the harness builds the loop
  ``for _ in repeat(None, n): fn()`` (``await afn()``), or, when ``raises`` is set,
  ``try: fn() except raises: pass``;
* ``loop`` or ``aloop``: a loop function written out by hand, for bodies that are not a call
  (an inline ``raise``, an ``async with`` block). Write it in the same
  ``for _ in repeat(None, n):`` shape so its bookkeeping matches the generated loops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import repeat

__all__ = [
    "AsyncLoop",
    "Case",
    "SyncLoop",
    "Target",
    "async_calls",
    "sync_calls",
]

SyncLoop = Callable[[int], object]
"""``run(n)``: perform the measured body ``n`` times."""
AsyncLoop = Callable[[int], Awaitable[object]]
"""``await run(n)``: perform the measured body ``n`` times inside the running event loop."""


@dataclass(frozen=True, slots=True)
class Case:
    """One measured variant: a row of its group's table.

    ``ref``, when set, makes this case a reference of its group: every row of the group gets a
    ratio column ``× {ref}`` (its time divided by this case's, per round, median over rounds).
    ``before`` runs, untimed, before every sample (to undo state a sample leaves behind).
    ``skip`` records a variant that cannot be measured, with the reason, instead of timing it.
    """

    group: str
    label: str
    fn: Callable[[], object] | None = None
    afn: Callable[[], Awaitable[object]] | None = None
    loop: SyncLoop | None = None
    aloop: AsyncLoop | None = None
    raises: type[BaseException] | None = None
    ref: str | None = None
    before: Callable[[], object] | None = None
    note: str = ""
    skip: str | None = None

    def __post_init__(self) -> None:
        given = [x for x in (self.fn, self.afn, self.loop, self.aloop) if x is not None]
        if self.skip is None and len(given) != 1:
            raise ValueError(
                f"case {self.group!r} / {self.label!r}: give exactly one of fn, afn, loop, aloop "
                f"(got {len(given)}), or skip='reason'"
            )
        if self.raises is not None and self.fn is None and self.afn is None:
            raise ValueError(
                f"case {self.label!r}: raises= needs fn or afn (a loop catches itself)"
            )

    @property
    def is_async(self) -> bool:
        """Whether the case must run inside an event loop."""
        return self.afn is not None or self.aloop is not None

    def sync_loop(self) -> SyncLoop:
        """The loop function of a sync case."""
        if self.loop is not None:
            return self.loop
        if self.fn is None:
            raise TypeError(f"case {self.label!r} is async")
        return sync_calls(self.fn, self.raises)

    def async_loop(self) -> AsyncLoop:
        """The loop function of an async case."""
        if self.aloop is not None:
            return self.aloop
        if self.afn is None:
            raise TypeError(f"case {self.label!r} is sync")
        return async_calls(self.afn, self.raises)


@dataclass(frozen=True, slots=True)
class Target:
    """A goal from the issue: ``case`` costs at most ``max_ratio`` × ``ref`` (both case labels).

    ``max_ratio=None`` lists the comparison in the report without a pass mark.
    """

    group: str
    case: str
    ref: str
    max_ratio: float | None
    text: str


def sync_calls(fn: Callable[[], object], raises: type[BaseException] | None = None) -> SyncLoop:
    """``for _ in repeat(None, n): fn()``, catching ``raises`` when given."""
    if raises is None:

        def run(n: int) -> None:
            for _ in repeat(None, n):
                fn()

        return run

    exc = raises

    def run_raising(n: int) -> None:
        for _ in repeat(None, n):
            try:  # noqa: SIM105 - contextlib.suppress would add its own cost to the figure
                fn()
            except exc:
                pass

    return run_raising


def async_calls(
    afn: Callable[[], Awaitable[object]], raises: type[BaseException] | None = None
) -> AsyncLoop:
    """``for _ in repeat(None, n): await afn()``, catching ``raises`` when given."""
    if raises is None:

        async def run(n: int) -> None:
            for _ in repeat(None, n):
                await afn()

        return run

    exc = raises

    async def run_raising(n: int) -> None:
        for _ in repeat(None, n):
            try:  # noqa: SIM105 - contextlib.suppress would add its own cost to the figure
                await afn()
            except exc:
                pass

    return run_raising
