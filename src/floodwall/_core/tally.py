"""A counter that threads bump without a lock and read exactly.

``tally.add()`` is ``next()`` of an :class:`itertools.count`: one C call, atomic under the
GIL, so the hot paths that count (a breaker's rejections, a window's successes) take no lock.
A read takes one more number from the same count and subtracts the numbers earlier reads took:
exact, and without parsing the count's ``repr``. Reads are rare (snapshots, metrics scrapes)
and share one lock, so a tally costs no lock of its own.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

__all__ = ["Tally", "values"]

_READS = threading.Lock()


class Tally:
    """How many times :meth:`add` was called (see :mod:`floodwall._core.tally`)."""

    __slots__ = ("_reads", "add", "counter")

    def __init__(self) -> None:
        self.counter = itertools.count()
        """The count itself: ``next(tally.counter)`` is :meth:`add` for the hottest paths (a
        builtin call is cheaper than the bound ``__next__``; benchmark group "tally: one bump")."""
        self.add = self.counter.__next__
        """Count one, lock-free (the number it returns is meaningless)."""
        self._reads = 0

    def _take(self) -> int:
        seen = self.add() - self._reads
        self._reads += 1
        return seen

    @property
    def value(self) -> int:
        """The number of :meth:`add` calls so far."""
        with _READS:
            return self._take()

    def __repr__(self) -> str:
        return f"Tally({self.value})"


def values(tallies: Iterable[Tally]) -> list[int]:
    """Read many tallies under one acquisition of the read lock."""
    with _READS:
        return [tally._take() for tally in tallies]
