"""Why jitter: ``python benchmarks/jitter_sim.py [--runs N] [--clients 10,20,...] [--seed S]``.

A port of the setup of the AWS Architecture Blog's backoff simulator (Marc Brooker, "Exponential
Backoff And Jitter", 2015; github.com/aws-samples/aws-arch-backoff-simulator), driven by
floodwall's own :mod:`floodwall.backoff` strategies on a simulated clock (a discrete-event queue:
no real time passes):

* N clients each want to update one row guarded by optimistic concurrency: read the version,
  then write with it; the write fails if anyone wrote in between, and the client backs off and
  starts over until its write succeeds;
* every message takes ``|N(10 ms, 2 ms)|`` of network delay;
* backoff base 5 ms, cap 2 s. The blog counts the first retry as ``n = 1`` and waits
  ``base × 2^n`` (10 ms); floodwall's exponential family waits ``base × 2^(n−1)`` before retry
  ``n``, so its ``base`` is 10 ms here to reproduce the same waits. Decorrelated jitter has no
  exponent (``uniform(base, 3 × previous)``) and keeps ``base`` 5 ms.

For each strategy and client count it reports the mean, over ``--runs`` runs, of the writes
attempted ("calls", the load on the contended resource) and of the time until the last client
succeeded. The blog's finding, checked at the end: with 100 clients full jitter needs less than
half the calls of un-jittered exponential backoff.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from floodwall.backoff import (
    Backoff,
    DecorrelatedJitter,
    EqualJitter,
    Exponential,
    FullJitter,
    NoBackoff,
)

NET_MEAN = 0.010
NET_SD = 0.002
BASE = 0.005
CAP = 2.0

STRATEGIES: dict[str, Backoff] = {
    "Exponential": Exponential(base=2 * BASE, cap=CAP),
    "Decorrelated": DecorrelatedJitter(base=BASE, cap=CAP),
    "EqualJitter": EqualJitter(base=2 * BASE, cap=CAP),
    "FullJitter": FullJitter(base=2 * BASE, cap=CAP),
    "None": NoBackoff(),
}

_READ, _READ_REPLY, _WRITE, _WRITE_REPLY = range(4)


@dataclass(frozen=True, slots=True)
class Result:
    calls: float
    """Mean writes per run (every write reaches the contended row)."""
    seconds: float
    """Mean simulated time until the last client succeeded."""


def simulate(strategy: Backoff, clients: int, rng: random.Random) -> tuple[int, float]:
    """One run: ``(writes attempted, time the last client finished)``."""

    def net() -> float:
        return abs(rng.gauss(NET_MEAN, NET_SD))

    version = 0
    calls = 0
    now = 0.0
    order = itertools.count()
    backoffs: list[Iterator[float]] = [strategy.delays(rng) for _ in range(clients)]
    # (time, tie-breaker, event, client, payload)
    queue: list[tuple[float, int, int, int, int]] = [
        (net(), next(order), _READ, client, 0) for client in range(clients)
    ]
    heapq.heapify(queue)
    while queue:
        now, _, event, client, payload = heapq.heappop(queue)
        if event == _READ:  # the server reads the row: reply with its version
            heapq.heappush(queue, (now + net(), next(order), _READ_REPLY, client, version))
        elif event == _READ_REPLY:  # the client writes with the version it read
            heapq.heappush(queue, (now + net(), next(order), _WRITE, client, payload))
        elif event == _WRITE:  # the server accepts the write only if nobody wrote since
            calls += 1
            ok = payload == version
            version += ok
            heapq.heappush(queue, (now + net(), next(order), _WRITE_REPLY, client, int(ok)))
        elif not payload:  # the write failed: back off, then read again
            wait = next(backoffs[client])
            heapq.heappush(queue, (now + net() + wait, next(order), _READ, client, 0))
    return calls, now


def measure(strategy: Backoff, clients: int, runs: int, seed: int) -> Result:
    rng = random.Random(seed)
    results = [simulate(strategy, clients, rng) for _ in range(runs)]
    return Result(
        calls=statistics.fmean(calls for calls, _ in results),
        seconds=statistics.fmean(seconds for _, seconds in results),
    )


def _table(title: str, counts: list[int], cells: dict[str, list[str]]) -> None:
    print(f"\n{title}\n")
    print("| clients | " + " | ".join(cells) + " |")
    print("| ---: |" + " ---: |" * len(cells))
    for row, clients in enumerate(counts):
        print(f"| {clients} | " + " | ".join(column[row] for column in cells.values()) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100, help="runs averaged per cell (100)")
    parser.add_argument(
        "--clients", default="10,20,30,40,50,60,70,80,90,100", help="comma-separated counts"
    )
    parser.add_argument("--seed", type=int, default=2015)
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.clients.split(",")]

    results = {
        name: [measure(strategy, n, args.runs, args.seed + n) for n in counts]
        for name, strategy in STRATEGIES.items()
    }
    print(
        f"Optimistic-concurrency contention, network |N({NET_MEAN * 1e3:g} ms, "
        f"{NET_SD * 1e3:g} ms)|, base {BASE * 1e3:g} ms, cap {CAP:g} s; mean of {args.runs} runs."
    )
    _table(
        "Calls (writes attempted per run)",
        counts,
        {name: [f"{r.calls:,.0f}" for r in rows] for name, rows in results.items()},
    )
    _table(
        "Completion time (ms until the last client succeeded)",
        counts,
        {name: [f"{r.seconds * 1e3:,.0f}" for r in rows] for name, rows in results.items()},
    )
    last = counts[-1]
    full, expo = results["FullJitter"][-1].calls, results["Exponential"][-1].calls
    ratio = full / expo
    verdict = "PASS" if ratio < 0.5 else "FAIL"
    print(
        f"\nAt {last} clients full jitter made {full:,.0f} calls, exponential {expo:,.0f}: "
        f"{ratio:.2f} × (< 0.5: {verdict})"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
