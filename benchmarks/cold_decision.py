"""One decision with cold caches: what a decision costs right after another process ran.

``python benchmarks/cold_decision.py [--per SECONDS] [--rounds N]``

On a busy machine the slowest decisions of ``benchmarks/million_keys.py`` are those that start
cold: caches and TLB filled by another process. This times, in the thread's CPU time, one
decision right after a 32 MB copy (which flushes the caches) and the next one (warm), for
``Frequency(5, per)`` on ``memory://`` past its bound (150 000 keys first: every decision is a
new key, evicting) and for ``million_keys.py``'s baseline body, interleaved round by round.
Reported: median and p90 of each, in µs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from floodwall import Frequency
from million_keys import baseline_body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=float, default=3600.0)
    parser.add_argument("--rounds", type=int, default=3000)
    options = parser.parse_args()
    allow = Frequency(limit=5, per=options.per).allow
    for i in range(150_000):
        allow(f"user-{i}")
    body, _ = baseline_body()
    source, target = bytearray(32 << 20), bytearray(32 << 20)
    thread = time.thread_time_ns
    cases: list[tuple[str, Callable[[str], object]]] = [("baseline", body), ("frequency", allow)]
    timings: dict[str, list[int]] = {f"{n} {s}": [] for n, _ in cases for s in ("cold", "warm")}
    i = 150_000
    for _ in range(options.rounds):
        for name, decide in cases:
            target[:] = source  # flush the caches
            for state in ("cold", "warm"):
                key = f"user-{i}"
                i += 1
                t0 = thread()
                decide(key)
                timings[f"{name} {state}"].append(thread() - t0)
    for label, values in timings.items():
        values.sort()
        median, p90 = values[len(values) // 2] / 1000, values[len(values) * 9 // 10] / 1000
        print(f"per={options.per:g} {label:16} median {median:7.1f} µs  p90 {p90:7.1f} µs")


if __name__ == "__main__":
    main()
