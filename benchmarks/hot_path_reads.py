"""Bytecodes and attribute reads one success-path call executes: a count, not a timing.

``python benchmarks/hot_path_reads.py`` prints, for a call through ``@CircuitBreaker``,
``@Bulkhead`` and a fixed window's ``try_acquire()``/``acquire()``, how many attribute loads and
stores and how many bytecodes ran (traced after two warm-up calls). On a shared, noisy machine
timings of two revisions differ by tens of percent from one run to the next; these counts do
not, so they answer "does the hot path read more than before?" exactly. Compare revisions by
running it with ``PYTHONPATH`` pointing at each one's ``src``.
"""

from __future__ import annotations

import collections
import dis
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import floodwall as fw
from floodwall.ratelimit import FixedWindow


def count(fn: Callable[[], Any]) -> tuple[int, int]:
    """``(attribute loads and stores, bytecodes)`` one call of ``fn`` executes."""
    fn()
    fn()
    seen: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen[dis.opname[frame.f_code.co_code[frame.f_lasti]]] += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    attributes = seen["LOAD_ATTR"] + seen["LOAD_METHOD"] + seen["STORE_ATTR"]
    return attributes, sum(seen.values())


def main() -> None:
    clock = fw.FakeClock()
    limiter = FixedWindow("1000000/s", clock=clock)

    @fw.CircuitBreaker(clock=clock)
    def through_breaker() -> int:
        return 1

    @fw.Bulkhead(clock=clock)
    def through_bulkhead() -> int:
        return 1

    cases: list[tuple[str, Callable[[], Any]]] = [
        ("@CircuitBreaker call", through_breaker),
        ("@Bulkhead call", through_bulkhead),
        ("FixedWindow.try_acquire()", limiter.try_acquire),
        ("FixedWindow.acquire()", limiter.acquire),
    ]
    for name, fn in cases:
        attributes, total = count(fn)
        print(f"{name}: {attributes} attribute loads/stores, {total} bytecodes")


if __name__ == "__main__":
    main()
